"""Is a job's node still there? Asked when only secondary symptoms (connection errors) are in.

Survivors of a dead node report connection errors within milliseconds, long before the node's
heartbeats count as missed. An agent answers a core-NATS ping while its process lives; a node
that does not answer may be the root cause, so the correlator waits for the heartbeat verdict
(``node.lost``) instead of blaming the network.

The ranks of a plain script (a job's own entrypoint) exit on a peer's failure instead of
parking, and the rank whose fault began it is not always heard first: it tears down its process
group before its interpreter, or tarries. While only such exits and peer errors are in, the
correlator waits until every rank of the generation has exited or reported, for at most
``root_cause_wait_s``.
"""

from __future__ import annotations

import asyncio

from unicron.services.detector.settings import DetectorSettings
from unicron.services.detector.signals import Candidate
from unicron.services.detector.suspicion import AgentAnswer, ask_agent
from unicron.shared.bus.api import EventBus
from unicron.shared.contracts.models import Job, NodeState, WorkerState, now
from unicron.shared.contracts.taxonomy import FailureKind
from unicron.shared.logging import get_logger
from unicron.shared.store.api import JobStore
from unicron.shared.store.hearing import Hearing


class Liveness:
    def __init__(
        self, bus: EventBus, state: JobStore, settings: DetectorSettings, hearing: Hearing
    ) -> None:
        self.bus = bus
        self.state = state
        self.settings = settings
        self.hearing = hearing

    async def answers(self, node_id: str) -> bool:
        answer = await ask_agent(self.bus, node_id, None, self.settings.ping_timeout_s)
        return answer == AgentAnswer.THIS_BOOT

    async def hold(self, candidates: list[Candidate]) -> float:
        """Seconds to keep waiting for a better root cause than ``candidates``."""
        if not candidates:
            return 0.0
        job = await self.state.get_job(candidates[0].job_id)
        if job is None or job.generation != candidates[0].generation:
            return 0.0
        live = [w for w in job.workers if w.state in (WorkerState.LAUNCHING, WorkerState.RUNNING)]
        nodes = sorted({w.node_id for w in live})
        replies = await asyncio.gather(*(self.answers(n) for n in nodes))
        silent = [n for n, ok in zip(nodes, replies, strict=True) if not ok]
        if silent:
            return await self._until_verdict(silent)
        reporters = {c.rank for c in candidates}
        if job.spec.entrypoint is not None:
            return self._script_hold(job, candidates, reporters)
        # Some ranks have not reported yet: one of them may be the hung one (its peers only wait).
        if all(c.kind == FailureKind.HANG for c in candidates) and len(reporters) < len(live):
            # The rank that hangs in its compute reports within a check interval of its peers.
            return self.settings.hang_grace_s
        if all(c.waiting for c in candidates) and len(reporters) < len(live):
            # Parked ranks name no culprit: the one that broke their collective is still to be
            # heard from (its exit report comes through its agent); all parked is a network
            # fault, recorded at once.
            return self.settings.park_grace_s
        return 0.0

    def _script_hold(
        self, job: Job, candidates: list[Candidate], reporters: set[int | None]
    ) -> float:
        if not all(c.secondary for c in candidates):
            return 0.0
        # A rank the executor already marked failed has an exit report on its way here too.
        ended = (WorkerState.SUCCEEDED, WorkerState.STOPPED)
        if {w.rank for w in job.workers if w.state not in ended} <= reporters:
            return 0.0
        waited = now() - min(c.observed_at for c in candidates)
        limit = self.settings.root_cause_wait_s
        return min(max(limit - waited, 0.0), limit)

    async def stepped_on(self, cause: Candidate) -> bool:
        """A rank found silent inside a collective, while the job completed a later step: it
        waited on a slow peer (a busy node), and there is no fault to record."""
        last_step = cause.evidence.get("last_step")
        if not (cause.kind == FailureKind.HANG and cause.waiting) or last_step is None:
            return False
        job = await self.state.get_job(cause.job_id)
        moved = job is not None and job.generation == cause.generation and job.step > last_step
        if moved and job is not None:
            get_logger(job_id=cause.job_id, node_id=cause.node_id).info(
                "hang dismissed: the job stepped on", rank=cause.rank, last_step=last_step,
                step=job.step,
            )  # fmt: skip
        return moved

    async def _until_verdict(self, node_ids: list[str]) -> float:
        waits = []
        for node_id in node_ids:
            node = await self.state.get_node(node_id)
            if node is None or node.state != NodeState.READY:
                continue  # already judged; its candidate is on its way
            remaining = self.settings.node_timeout_s - self.hearing.silent_s(node, now())
            waits.append(remaining + 2 * self.settings.node_check_interval_s)
        return max(0.0, min(max(waits, default=0.0), self.settings.node_timeout_s + 1.0))
