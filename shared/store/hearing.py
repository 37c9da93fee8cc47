"""How long a node has been silent, as one observer could tell (docs/design.md §6).

Agents write their heartbeats into Redis; the detector and the planner read them there. While
Redis is away no heartbeat can land, and while an observer is not running it hears nothing:
a record whose last beat predates that gap says nothing about the node. So a node's silence
counts from the later of its last beat and the moment this observer last started hearing (its
start, or its first read of the nodes after a failed one). Without this, every node of the
cluster reads as lost the moment Redis comes back, before the agents' next beat.
"""

from __future__ import annotations

from collections.abc import Callable

from unicron.shared.contracts.models import NodeRecord, now
from unicron.shared.store.api import JobStore


class Hearing:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = now) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self.since = clock()  # heartbeats older than this could have been missed by us
        self._deaf = False

    async def nodes(self, state: JobStore) -> list[NodeRecord]:
        """Every node record; a read that fails (Redis away) starts a gap in our hearing."""
        at = self.clock()
        try:
            nodes = await state.list_nodes()
        except BaseException:
            self._deaf = True
            raise
        if self._deaf:
            self.since, self._deaf = at, False
        return nodes

    def silent_s(self, node: NodeRecord, at: float) -> float:
        return node.silent_s(at, self.since)
