"""Node health beyond heartbeats: quarantine of nodes that fail repeatedly, and its end.

Only failures that are the node's own are counted per node in Redis: the SEV1 hardware faults
(ECC, NVLink, invalid DMA, GPU driver, node down). A crash, a hang or a straggler may be the
job's or the network's, and a fault a drill injected (``evidence["drill"]``) is nobody's, so
neither counts. ``quarantine_threshold`` counted failures within the window put the node in
QUARANTINED for a cooldown, during which the planner does not use it. The periodic
``review`` ends quarantines and restores LOST nodes whose heartbeats came back.
"""

from __future__ import annotations

from collections.abc import Callable

from unicron.services.detector.settings import DetectorSettings
from unicron.shared.bus.api import EventBus
from unicron.shared.contracts.events import FailureDetected, NodeStateChanged
from unicron.shared.contracts.models import NodeRecord, NodeState, now
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.contracts.taxonomy import nodes_own
from unicron.shared.logging import get_logger
from unicron.shared.store.api import JobStore

_Mutation = Callable[[NodeRecord], bool]


def blames_node(failure: FailureDetected) -> bool:
    """Whether ``failure`` counts against its node: a fault of the node's own, not a drill's
    (an escalated crash is SEV1 because the job's recoveries failed, which says nothing about
    the node)."""
    return (
        failure.node_id is not None
        and nodes_own(failure.category)
        and not failure.evidence.get("drill")
    )


class NodeHealth:
    def __init__(self, bus: EventBus, state: JobStore, settings: DetectorSettings) -> None:
        self.bus = bus
        self.state = state
        self.settings = settings

    async def blame(self, failure: FailureDetected) -> None:
        if not blames_node(failure) or failure.node_id is None:
            return
        await self.count(failure.node_id, failure.failure_id, failure.observed_at)

    async def count(self, node_id: str, fault_id: str, at: float) -> None:
        """Count one fault of the node's own (once per ``fault_id``); quarantine at the
        threshold. A hardware fault on a node that runs no job has no failure to blame it by."""
        window = self.settings.quarantine_window_s
        count = await self.state.record_node_failure(node_id, fault_id, at, window)
        if count >= self.settings.quarantine_threshold:
            await self._quarantine(node_id, count)

    async def _quarantine(self, node_id: str, count: int) -> None:
        until = now() + self.settings.quarantine_cooldown_s
        reason = f"{count} failures within {self.settings.quarantine_window_s:.0f}s"

        def mark(node: NodeRecord) -> bool:
            if node.state not in (NodeState.READY, NodeState.LOST):
                return False
            node.set_state(NodeState.QUARANTINED, reason, by=ServiceRole.DETECTOR)
            node.quarantined_until = until
            return True

        await self._change(node_id, mark, reason)

    async def review(self) -> None:
        at = now()
        for node in await self.state.list_nodes():
            fresh = node.silent_s(at) <= self.settings.node_timeout_s
            expired = node.quarantined_until is not None and node.quarantined_until <= at
            if node.state == NodeState.QUARANTINED and expired:
                reason = "quarantine ended"
                await self._change(node.id, _release(fresh, at, reason), reason)
            elif node.state == NodeState.LOST and fresh:
                reason = "heartbeats resumed"
                await self._change(node.id, _release(True, at, reason), reason)

    async def _change(self, node_id: str, mutate: _Mutation, reason: str) -> None:
        before = await self.state.get_node(node_id)
        after = await self.state.update_node(node_id, mutate)
        if before is None or after is None or before.state == after.state:
            return
        get_logger(node_id=node_id).warning(
            "node state changed", old=before.state.value, new=after.state.value, reason=reason
        )
        await self.bus.publish_event(
            NodeStateChanged(
                node_id=node_id,
                old=before.state,
                new=after.state,
                reason=reason,
                until=after.quarantined_until,  # so a rebuild after a Redis loss restores it
            )
        )


def _release(fresh: bool, at: float, reason: str) -> _Mutation:
    # Only an unexpired quarantine is re-checked on the record as read now, so this may write
    # over a record that changed since the review listed it (rows the node table allows).
    def mutate(node: NodeRecord) -> bool:
        if node.state == NodeState.QUARANTINED and (node.quarantined_until or 0) > at:
            return False
        node.set_state(
            NodeState.READY if fresh else NodeState.LOST, reason, by=ServiceRole.DETECTOR
        )
        node.quarantined_until = None
        return True

    return mutate
