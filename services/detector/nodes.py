"""Node health from agent heartbeats: a node silent for ``heartbeat_misses`` intervals, and
found gone when asked, is lost.

Silence counts only while the detector could have heard the node
(:mod:`unicron.shared.store.hearing`): a Redis outage or a restart of the detector is no node's
fault. Silence alone is a suspicion: once a node has missed all but its last beat the detector
asks its agent, and at its deadline weighs the answer with what else it knows
(:mod:`unicron.services.detector.suspicion`); a node that answers keeps its jobs running, and a
verdict the observer cannot give yet waits for the next check.

A lost node is marked LOST (so the planner stops using it), ``node.lost`` is published, and every
job with a worker of its running generation on that node gets a SEV1 failure candidate. A
QUARANTINED or DRAINED node that falls silent keeps its state, but its jobs' workers there are
failed the same way.
"""

from __future__ import annotations

from unicron.services.detector.correlate import Correlator
from unicron.services.detector.settings import DetectorSettings
from unicron.services.detector.signals import Candidate
from unicron.services.detector.suspicion import NodeVerdict, Suspicion, Verdict, judge, mass_silence
from unicron.shared.bus.api import EventBus
from unicron.shared.contracts.events import NodeLost
from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.models import Job, NodeRecord, NodeState, WorkerState, now
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind
from unicron.shared.logging import get_logger
from unicron.shared.store.api import JobStore
from unicron.shared.store.hearing import Hearing

_LIVE_WORKER = (WorkerState.LAUNCHING, WorkerState.RUNNING)


def seats_on(jobs: list[Job], node_id: str) -> list[tuple[WorkerKey, list[int]]]:
    """Each unfinished job with a live worker on the node: the seat a fault of the node names
    (its lowest rank there) and all its ranks there."""
    seats = []
    for job in jobs:
        if job.state.terminal:
            continue
        ranks = sorted(
            w.rank for w in job.workers if w.node_id == node_id and w.state in _LIVE_WORKER
        )
        if ranks:
            seats.append((WorkerKey(job.id, job.generation, ranks[0]), ranks))
    return seats


class NodeMonitor:
    def __init__(
        self,
        bus: EventBus,
        state: JobStore,
        correlator: Correlator,
        hearing: Hearing,
        suspicion: Suspicion,
    ) -> None:
        self.bus = bus
        self.state = state
        self.correlator = correlator
        self.hearing = hearing
        self.suspicion = suspicion
        interval = suspicion.settings.heartbeat_interval_s
        # Asked once all but the last beat are missed, so the answer is in by the deadline.
        self.suspect_after_s = max(hearing.timeout_s - interval, hearing.timeout_s / 2)
        # When the next node becomes a suspect if no heartbeat comes first: the service wakes
        # then instead of a whole polling interval later, so a loss is seen on time.
        self.next_due = float("inf")
        # node → the last heartbeat its silence was judged at: judged once per silence
        self._judged: dict[str, float] = {}
        self._excused: dict[str, float] = {}  # node → the beat whose silence was excused (logged)

    async def check(self) -> list[str]:
        """Ask after every newly suspect node and judge those past their deadline; returns the
        ids of the nodes found lost. Reads only the nodes the heartbeat index says are silent."""
        at, timeout = now(), self.hearing.timeout_s
        self.suspicion.observe(at)
        suspects = []
        for node_id, beat in await self.hearing.silent(self.state, at, self.suspect_after_s):
            if self._judged.get(node_id) == beat:
                continue
            node = await self.state.get_node(node_id)
            if node is None or node.state == NodeState.LOST:
                continue
            if self.hearing.silent_s(node, at) > self.suspect_after_s:  # not heard since
                suspects.append(node)
        self.suspicion.cleared(self.suspicion.asking() - {n.id for n in suspects})
        for node in suspects:
            self.suspicion.suspect(node, at)
        due = [n for n in suspects if self.hearing.silent_s(n, at) > timeout]
        lost = await self._judge_all(due, at) if due else []
        self.next_due = min(
            [await self.hearing.next_due(self.state, at, self.suspect_after_s)]
            + [self._judge_again_at(n, at) for n in suspects if n.id not in lost]
        )
        return lost

    def _judge_again_at(self, suspect: NodeRecord, at: float) -> float:
        """A suspect is judged at its deadline; one found not lost, when its answer is stale."""
        left = self.hearing.timeout_s - self.hearing.silent_s(suspect, at)
        return at + (left if left > 0 else self.settings.heartbeat_interval_s)

    async def _judge_all(self, due: list[NodeRecord], at: float) -> list[str]:
        # More than two due before the nodes are counted: the count reads every node record.
        mass = len(due) > 2 and mass_silence(len(due), await self._in_service(), self.settings)
        lost = []
        for node in due:
            silent_s = self.hearing.silent_s(node, at)
            evidence = await self.suspicion.evidence(node, silent_s, self.state.get_job, mass)
            verdict = judge(evidence, self.settings)
            if verdict.verdict != NodeVerdict.LOST:
                self._excuse(node, verdict, silent_s)
                continue
            if node.state == NodeState.READY:
                if await self._mark_lost(node.id, at, verdict):
                    lost.append(node.id)
            else:
                await self._out_of_service_silent(node)
            self._judged[node.id] = node.last_heartbeat  # once handled: a failed write retries
        return lost

    @property
    def settings(self) -> DetectorSettings:
        return self.suspicion.settings

    async def _in_service(self) -> int:
        return sum(n.state == NodeState.READY for n in await self.state.list_nodes())

    def _excuse(self, node: NodeRecord, verdict: Verdict, silent_s: float) -> None:
        """Said once per silence: a node heard otherwise, or an observer that doubts itself."""
        if self._excused.get(node.id) == node.last_heartbeat:
            return
        self._excused[node.id] = node.last_heartbeat
        get_logger(node_id=node.id).warning(
            "silent node not lost", verdict=verdict.verdict.value, why=verdict.why,
            silent_s=round(silent_s, 3),
        )  # fmt: skip

    async def _out_of_service_silent(self, node: NodeRecord) -> None:
        """A quarantined or drained node stays so (its cooldown or the operator's decision
        outlives the silence), but workers still running on it are gone with it."""
        get_logger(node_id=node.id).warning("out-of-service node silent", state=node.state.value)
        await self._fail_jobs_on(node)

    async def _mark_lost(self, node_id: str, at: float, verdict: Verdict) -> bool:
        marked, timeout = False, self.hearing.timeout_s

        def mark(node: NodeRecord) -> bool:
            nonlocal marked
            # Re-checked inside the transaction: a heartbeat may have arrived meanwhile.
            marked = node.state == NodeState.READY and self.hearing.silent_s(node, at) > timeout
            if marked:
                node.set_state(NodeState.LOST, "heartbeats stopped", by=ServiceRole.DETECTOR)
            return marked

        updated = await self.state.update_node(node_id, mark)
        if updated is None or not marked:
            return False
        get_logger(node_id=node_id).warning(
            "node lost", silent_s=round(self.hearing.silent_s(updated, at), 3), why=verdict.why
        )
        await self.bus.publish_event(
            NodeLost(
                node_id=node_id, boot_id=updated.boot_id, last_heartbeat=updated.last_heartbeat
            )
        )
        await self._fail_jobs_on(updated)
        return True

    async def _fail_jobs_on(self, node: NodeRecord) -> None:
        for seat, ranks in seats_on(await self.state.list_jobs(), node.id):
            evidence = {"ranks": ranks, "boot_id": node.boot_id}
            await self.correlator.add(
                Candidate.of(
                    node.id,
                    seat,
                    FailureKind.NODE_LOST,
                    FailureCategory.NODE_DOWN,
                    node.last_heartbeat,
                    evidence,
                )
            )
