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

    async def silent(
        self, state: JobStore, at: float, after_s: float | None = None
    ) -> list[tuple[str, float]]:
        """(node id, last heartbeat) of each node silent for more than ``after_s`` (the timeout
        by default) at ``at``, by the store's heartbeat index; a read that fails (Redis away)
        starts a gap in our hearing."""
        after_s = self.timeout_s if after_s is None else after_s
        try:
            heard = await state.heard_before(at - after_s)
        except BaseException:
            self._deaf = True
            raise
        if self._deaf:
            self.since, self._deaf = at, False
        if at - self.since <= after_s:
            return []  # too soon after the gap: none of them could have been heard
        return heard

    async def next_due(self, state: JobStore, at: float, after_s: float | None = None) -> float:
        """When the next node has been silent for ``after_s`` (the timeout by default) if no
        heartbeat comes first (inf: none will)."""
        after_s = self.timeout_s if after_s is None else after_s
        oldest = await state.first_heard_after(at - after_s)
        due = [self.since + after_s] if self.since + after_s > at else []
        if oldest is not None:
            due.append(max(oldest, self.since) + after_s)
        return min(due, default=float("inf"))

    def silent_s(self, node: NodeRecord, at: float) -> float:
        return node.silent_s(at, self.since)
