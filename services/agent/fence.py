"""Self-fencing: a node cut off from the control plane stops its own workers.

The detector counts a node lost once its heartbeat has been silent for ``node_timeout_s``
(heartbeat interval x misses); the executor then re-places its ranks under a new generation and
sends the node a stop for the old one, which it gets on NATS. A node that NATS still reaches
gets that stop at once. One cut off from both would go on training under the old generation,
and could write a checkpoint, until it is back. So when no heartbeat has landed in Redis for
``node_timeout_s``, counted from the start of the last one that did, and NATS does not answer a
round trip either, the agent kills every worker's process group, as a stop does.

A Redis that is away for every node is not a cut-off: the detector judges no one while it
cannot hear (``unicron.shared.store.hearing``), NATS still answers, and the workers keep stepping
(docs/design.md §6). NATS away alone never makes a node lost. A heartbeat that lands again lifts
the fence; it refreshes the node's record, now with no workers, and the detector takes a LOST
node back to READY.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from nats.errors import NoRespondersError
from unicron.shared.bus.bus import Bus
from unicron.shared.bus.natsauth import JETSTREAM_INFO
from unicron.shared.logging import get_logger

log = get_logger(component="fence")
PROBE_S = 1.0  # longest NATS round trip that still counts as an answer


class Fence:
    def __init__(
        self,
        node_id: str,
        timeout_s: float,
        stop_workers: Callable[[], Awaitable[int]],
        nats_answers: Callable[[float], Awaitable[bool]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.stop_workers = stop_workers  # kills every worker; returns how many it killed
        self.nats_answers = nats_answers  # a round trip through NATS within the given seconds
        self.clock = clock
        self.probe_s = min(PROBE_S, timeout_s / 2)
        self.heard_at = clock()  # a fresh agent has no workers to fence yet
        self.fenced = False
        self.fences = 0  # how many times it fenced, for tests and metrics
        self._heard = asyncio.Event()
        self.spared = False  # NATS answered during this outage (said once)
        self._log = log.bind(node_id=node_id)

    def heard(self, since: float) -> None:
        """A heartbeat that started at ``since`` (``clock`` time) landed in Redis."""
        self.heard_at = max(self.heard_at, since)
        if self.fenced:
            self._log.info("heartbeat lands again; node back with no workers")
        self.fenced = self.spared = False
        self._heard.set()

    async def run(self) -> None:
        """Watch the heartbeat until cancelled. NATS is asked ``probe_s`` before the deadline,
        so that a node cut off from both is fenced when the detector may first count it lost."""
        while True:
            since = self.heard_at
            due = since + self.timeout_s
            if self.fenced:
                await self._beat_within(None, since)
                continue
            if await self._beat_within(due - self.probe_s - self.clock(), since):
                continue
            began = self.clock()
            if await self.nats_answers(self.probe_s):
                self._spare()
                await self._beat_within(began + self.probe_s - self.clock(), since)  # ask again
            elif not await self._beat_within(due - self.clock(), since):
                await self._fence()

    async def _beat_within(self, seconds: float | None, since: float) -> bool:
        """Whether a heartbeat later than ``since`` lands within ``seconds`` (None: ever)."""
        self._heard.clear()
        if self.heard_at > since:
            return True
        with contextlib.suppress(TimeoutError):
            wait = None if seconds is None else max(0.0, seconds)
            await asyncio.wait_for(self._heard.wait(), wait)
        return self.heard_at > since

    def _spare(self) -> None:
        if not self.spared:
            self.spared = True
            self._log.warning(
                "no heartbeat lands but NATS answers: Redis is away, this node is not cut off; "
                "workers keep running",
                silent_s=round(self.clock() - self.heard_at, 2),
            )

    async def _fence(self) -> None:
        self.fenced = True
        self.fences += 1
        silent_s = round(self.clock() - self.heard_at, 2)
        killed = await self.stop_workers()
        self._log.error(
            "cut off from Redis and NATS for node_timeout_s: the control plane counts this node "
            "lost and re-places its ranks, so every worker here was stopped",
            stopped=killed,
            silent_s=silent_s,
            node_timeout_s=self.timeout_s,
        )


def round_trip(bus: Bus) -> Callable[[float], Awaitable[bool]]:
    """Whether a request comes back through NATS in time. It asks JetStream for its account
    info: read-only, answered by the server itself, and a request every login may make
    (``unicron.shared.bus.natsauth``); an agent may not send requests to its own ping subject."""

    async def answers(timeout_s: float) -> bool:
        if not bus.connected:
            return False
        try:
            await asyncio.wait_for(bus.request(JETSTREAM_INFO, b"", timeout_s), timeout_s + 0.1)
        except NoRespondersError:
            return True  # the server itself said so
        except Exception:  # whatever the client raises, no answer came back
            return False
        return True

    return answers
