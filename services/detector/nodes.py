"""Node health from agent heartbeats: a node silent for ``heartbeat_misses`` intervals is lost.

Silence counts only while the detector could have heard the node
(:mod:`unicron.shared.store.hearing`): a Redis outage or a restart of the detector is no node's
fault.

A lost node is marked LOST (so the planner stops using it), ``node.lost`` is published, and every
job with a worker of its running generation on that node gets a SEV1 failure candidate. A
QUARANTINED or DRAINED node that falls silent keeps its state, but its jobs' workers there are
failed the same way.
"""

from __future__ import annotations

from unicron.services.detector.correlate import Correlator
from unicron.services.detector.signals import Candidate
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
        self, bus: EventBus, state: JobStore, correlator: Correlator, hearing: Hearing
    ) -> None:
        self.bus = bus
        self.state = state
        self.correlator = correlator
        self.hearing = hearing
        # When the next READY node falls silent if no heartbeat comes first: the service wakes
        # then instead of a whole polling interval later, so a loss is seen on time.
        self.next_due = float("inf")
        # node → the last heartbeat its silence was judged at: judged once per silence
        self._judged: dict[str, float] = {}

    async def check(self) -> list[str]:
        """Mark every newly silent node lost; returns their ids. Reads only the nodes the
        heartbeat index says are silent, not every node."""
        at, timeout = now(), self.hearing.timeout_s
        lost = []
        for node_id, beat in await self.hearing.silent(self.state, at):
            if self._judged.get(node_id) == beat:
                continue
            node = await self.state.get_node(node_id)
            if node is None or self.hearing.silent_s(node, at) <= timeout:
                continue  # gone, or heard since the index was read
            if node.state == NodeState.READY:
                if await self._mark_lost(node.id, at):
                    lost.append(node.id)
            elif node.state != NodeState.LOST:
                await self._out_of_service_silent(node)
            self._judged[node_id] = beat  # only once handled: a failed write is tried again
        self.next_due = await self.hearing.next_due(self.state, at)
        return lost

    async def _out_of_service_silent(self, node: NodeRecord) -> None:
        """A quarantined or drained node stays so (its cooldown or the operator's decision
        outlives the silence), but workers still running on it are gone with it."""
        get_logger(node_id=node.id).warning("out-of-service node silent", state=node.state.value)
        await self._fail_jobs_on(node)

    async def _mark_lost(self, node_id: str, at: float) -> bool:
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
            "node lost", silent_s=round(self.hearing.silent_s(updated, at), 3)
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
