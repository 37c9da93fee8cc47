"""Correlation: the many reports one fault causes become one failure, naming its root cause.

When a rank dies, its peers fail in the collective a few milliseconds later with connection
errors. A candidate that is surely a root cause (a kill, a lost node, a CUDA error) is reported
at once; a secondary one (a connection error) waits a short window for a better explanation,
and longer while ``hold`` says a better one may still come (a node that stopped answering, a
rank that has not reported while its peers only wait on it or, in a plain script, exit on
it). Each new report of the fault asks ``hold`` again, so the wait ends as soon as the last
rank has spoken. A rank that is gone (an exit, even with code 1) ends the wait of ranks that
are only waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from unicron.services.detector.signals import Candidate, root_cause
from unicron.shared.outage import Outage
from unicron.shared.tasks import cancel_and_wait

# Records the root cause; False when it was dismissed as no fault at all, so that later reports
# of the same generation are still heard.
Emit = Callable[[Candidate], Awaitable[bool]]
# Given the candidates so far, how many more seconds to wait for a root cause (0: none); asked
# again when another candidate arrives meanwhile.
Hold = Callable[[list[Candidate]], Awaitable[float]]


async def _no_hold(_: list[Candidate]) -> float:
    return 0.0


_Key = tuple[str, int]


class Correlator:
    def __init__(self, window_s: float, emit: Emit, hold: Hold = _no_hold) -> None:
        self.window_s = window_s
        self._emit = emit
        self._hold = hold
        self._pending: dict[_Key, list[Candidate]] = {}
        self._done: set[_Key] = set()
        self._heard: dict[_Key, asyncio.Event] = {}  # set when a held fault gets a new report
        self._timers: set[asyncio.Task[None]] = set()

    async def add(self, candidate: Candidate) -> None:
        key = (candidate.job_id, candidate.generation)
        if key in self._done:
            return
        group = self._pending.setdefault(key, [])
        group.append(candidate)
        if key in self._heard:
            self._heard[key].set()
        # A rank that is gone explains the ranks that only wait on it: no need to wait more.
        explains = not candidate.waiting and any(c.waiting for c in group)
        if not candidate.secondary or explains:
            await self._flush(key)
        elif len(group) == 1:
            timer = asyncio.create_task(self._flush_later(key))
            self._timers.add(timer)
            timer.add_done_callback(self._timers.discard)

    async def _flush_later(self, key: _Key) -> None:
        await asyncio.sleep(self.window_s)
        await self._held(key)
        # No report is left to retry this one: it waits out an outage itself.
        await Outage("failure record", component="detector").through(lambda: self._flush(key))

    async def _held(self, key: _Key) -> None:
        """Wait as long as ``hold`` asks, asking again after each new report of the fault."""
        heard = self._heard.setdefault(key, asyncio.Event())
        try:
            while True:
                heard.clear()  # before asking: a report that comes while it is asked counts
                extra = await self._hold(list(self._pending.get(key, [])))
                if extra <= 0:
                    return
                try:
                    await asyncio.wait_for(heard.wait(), extra)
                except TimeoutError:
                    return
                # A rank's exception and its exit travel apart: give the other a window too.
                await asyncio.sleep(self.window_s)
        finally:
            self._heard.pop(key, None)

    async def _flush(self, key: _Key) -> None:
        group = self._pending.pop(key, None)
        if not group:
            return
        self._done.add(key)
        try:
            if not await self._emit(root_cause(group)):
                self._done.discard(key)
        except BaseException:
            # Not recorded (Redis away, say): the bus hands the report back, and its retry
            # must find the fault still pending, not already done.
            self._done.discard(key)
            self._pending[key] = group + self._pending.get(key, [])
            raise

    async def close(self) -> None:
        await cancel_and_wait(list(self._timers), what="correlation timers")
