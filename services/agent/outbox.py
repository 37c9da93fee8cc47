"""The agent's way out to the bus: reports, events and dead letters, in order, never blocking.

Workers, the supervisor and the GPU health watch hand messages to the outbox and go on at
once; one task publishes them in order and retries while NATS is away, so neither training nor
the heartbeat ever waits on the control plane (docs/design.md §6). While disconnected it does
not publish at all: nats-py would buffer each retry and flush them all on reconnect as
duplicates.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from unicron.services.agent.api import Report as Report
from unicron.services.agent.api import Sink as Sink
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
    send: Callable[[], Awaitable[object]]
    what: str
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
        self._task: asyncio.Task[None] | None = None
        self._outage = Outage("outbox publish", component="outbox")

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="outbox")

    def report(self, report: AnyReport) -> None:
        droppable = isinstance(report, StepCompleted | StepsCompleted)
        self._put(_Item(lambda: self.bus.publish_report(report), report.kind, droppable))

    def event(self, data: EventData) -> None:
        self._put(_Item(lambda: self.bus.publish_event(data), data.TYPE, False))

    def dead_letter(self, subject: str, payload: bytes, reason: str) -> None:
        send = lambda: self.bus.dead_letter(subject, payload, reason, 1)  # noqa: E731
        self._put(_Item(send, "dead_letter", False))

    def _put(self, item: _Item) -> None:
        if item.droppable and len(self._items) >= self.max_pending:
            self.dropped += 1
            if self.dropped % 1000 == 1:  # say so, but not once per step
                log.warning("bus backlog full; dropping step telemetry", dropped=self.dropped)
            return
        self._items.append(item)
        self._idle.clear()
        self._wake.set()

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
                await item.send()
                self._outage.ok()
                return
            except Exception as exc:
                self._outage.failed(exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    async def close(self, timeout_s: float = 3.0) -> None:
        """Give pending messages ``timeout_s`` to go out, then stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        if self._items:
            log.warning("outbox closed with messages unsent", pending=len(self._items))
        if self._task is not None:
            await cancel_and_wait([self._task], what="outbox sender")
