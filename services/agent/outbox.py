"""The agent's way out to the bus: reports, events and dead letters, in order, never blocking.

Workers, the supervisor and the GPU health watch hand messages to the outbox and go on at
once; one task publishes them in order and retries while NATS is away, so neither training nor
the heartbeat ever waits on the control plane (docs/design.md §6). While disconnected it does
not publish at all: nats-py would buffer each retry and flush them all on reconnect as
duplicates.

Storing is one message at a time, and a message waits for JetStream's acknowledgement of all
those before it: a stream electing a leader, or one slowed by a checkpoint snapshot's megabytes,
held a worker's exit behind seconds of step telemetry (detections of 2-7 s in
``bench/chaos.py --ha``). So a second task sends each message's fast-lane copy
(:mod:`unicron.shared.bus.lane`) as soon as it is queued, in order, and the store follows at
its own pace.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass

from unicron.services.agent.api import Report as Report
from unicron.services.agent.api import Sink as Sink
from unicron.shared.bus.api import Outgoing, event_message, report_message
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import EventData
from unicron.shared.contracts.reports import AnyReport, StepCompleted, StepsCompleted
from unicron.shared.logging import get_logger
from unicron.shared.outage import Outage
from unicron.shared.tasks import cancel_and_wait

log = get_logger(component="outbox")

MAX_PENDING = 10_000
RETRY_MIN_S = 0.1
RETRY_MAX_S = 2.0
DISCONNECTED_POLL_S = 0.05


@dataclass
class _Item:
    message: Outgoing
    droppable: bool  # step telemetry may be dropped under backlog; exits and failures never


class Outbox:
    def __init__(self, bus: Bus, max_pending: int = MAX_PENDING) -> None:
        self.bus = bus
        self.max_pending = max_pending
        self.dropped = 0
        self._items: collections.deque[_Item] = collections.deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._unlaned: list[Outgoing] = []  # queued since the lane task last looked
        self._lane_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._outage = Outage("outbox publish", component="outbox")

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(), name="outbox"),
            asyncio.create_task(self._lane(), name="outbox lane"),
        ]

    def report(self, report: AnyReport) -> None:
        droppable = isinstance(report, StepCompleted | StepsCompleted)
        self._put(_Item(report_message(report), droppable))

    def event(self, data: EventData) -> None:
        # Wrapped once: the event keeps its id and time through every retry.
        self._put(_Item(event_message(self.bus.wrap(data)), False))

    def dead_letter(self, subject: str, payload: bytes, reason: str) -> None:
        self._put(_Item(self.bus.dead_letter_message(subject, payload, reason, 1), False))

    def _put(self, item: _Item) -> None:
        if item.droppable and len(self._items) >= self.max_pending:
            self.dropped += 1
            if self.dropped % 1000 == 1:  # say so, but not once per step
                log.warning("bus backlog full; dropping step telemetry", dropped=self.dropped)
            return
        self._items.append(item)
        self._unlaned.append(item.message)
        self._idle.clear()
        self._wake.set()
        self._lane_wake.set()

    async def _lane(self) -> None:
        while True:
            await self._lane_wake.wait()
            self._lane_wake.clear()
            fresh, self._unlaned = self._unlaned, []
            if self.bus.connected:  # else each is laned when it is stored
                await self.bus.lane_ahead(fresh)

    async def _run(self) -> None:
        while True:
            if not self._items:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._send(self._items[0])
            self._items.popleft()

    async def _send(self, item: _Item) -> None:
        """Publish one item, retrying with backoff until it is stored by JetStream."""
        delay = RETRY_MIN_S
        while True:
            if not self.bus.connected:
                # nats-py reconnects; a report waiting for it goes the moment it is back, not
                # after a back-off grown while the server was away (a hang's report is late
                # by exactly that much).
                await asyncio.sleep(DISCONNECTED_POLL_S)
                continue
            try:
                await self.bus.send(item.message)
                self._outage.ok()
                return
            except Exception as exc:
                self._outage.failed(exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    @property
    def pending(self) -> int:
        """Messages not stored yet."""
        return len(self._items)

    async def drained(self, timeout_s: float) -> None:
        """Until every message queued so far is stored; TimeoutError after ``timeout_s``."""
        await asyncio.wait_for(self._idle.wait(), timeout_s)

    async def close(self, timeout_s: float = 3.0) -> None:
        """Give pending messages ``timeout_s`` to go out, then stop."""
        with contextlib.suppress(TimeoutError):
            await self.drained(timeout_s)
        if self._items:
            log.warning("outbox closed with messages unsent", pending=len(self._items))
        await cancel_and_wait(self._tasks, what="outbox sender")
