"""One JetStream message through a consumer: parse, check its claims, handle, ack.

What each outcome means: a message that does not parse, or whose claims the state contradicts,
is dead-lettered and terminated at once; one whose handler fails is handed back a few times,
then dead-lettered; while Redis or NATS is away the handler is retried in place, so the outage
spends none of the message's deliveries. A message is acked only after its handler returned.

Redelivery is soon for the first time and slower after: when a service is killed mid-message
(or with messages delivered but not yet handled), its restarted consumer gets them back about a
second later instead of after a long ack wait — a detector killed during a fault must not delay
that fault's detection by half a minute. So that a live but busy consumer is not sent its own
messages again, every message it holds — the one being handled and those queued behind it — is
kept with ``in_progress`` until it is acked, and the server hands it at most
``MAX_ACK_PENDING`` at a time.

A consumer with a ``batch`` handler gets the messages that queued up behind the one it handled
in one call (up to ``MAX_ACK_PENDING``), in order: a burst of reports about one job costs one
write of its record, not one per report. Each message is still parsed, checked and, when its
batch succeeded, acked on its own; a batch that fails is handled again one message at a time,
so only a message that fails alone is retried or dead-lettered.

A message may come twice: from the stream and from the fast lane (:mod:`unicron.shared.bus.lane`).
Whichever copy comes first is handled; the other is skipped by the message's id, and a lane
copy is never acknowledged, handed back or dead-lettered: its stream copy is the record. A lane
copy not handled shuts the lane until its stream copy is settled (:class:`LaneGap`), so that no
later message overtakes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import ValidationError
from unicron.shared.bus.lane import Handled, LaneGap, LaneMsg, is_lane, message_id
from unicron.shared.logging import get_logger
from unicron.shared.metrics import ConsumerMetrics
from unicron.shared.outage import Outage, is_outage
from unicron.shared.tasks import cancel_and_wait

T = TypeVar("T")
log = get_logger(component="bus")

MAX_DELIVER = 5
# Seconds before each redelivery of an unacked message (the first doubles as the ack wait).
REDELIVERY_S = (1.0, 5.0, 15.0, 30.0, 30.0)
KEEP_ALIVE_S = REDELIVERY_S[0] / 3
MAX_ACK_PENDING = 256
# Holding a message through an outage stops here: it is handed back to the server then.
OUTAGE_HOLD_S = 90.0
# What a parser raises for a message it cannot take: that message is dead-lettered, not retried.
PARSE_ERRORS = (ValidationError, ValueError, KeyError)


class ClaimRefusedError(Exception):
    """A well-formed message whose claims the state contradicts (a report about a worker its
    node does not run, a drill the API never marked): dead-lettered at once, never retried,
    because nothing on the bus is trusted just because it arrived (docs/design.md §6)."""


Received = Msg | LaneMsg
Claim = Callable[[str, T], Awaitable[None]]
Batch = Callable[[list[T]], Awaitable[None]]
DeadLetterSink = Callable[[str, bytes, str, int], Awaitable[None]]


def consumer_config(durable: str, deliver_new: bool) -> ConsumerConfig:
    policy = DeliverPolicy.NEW if deliver_new else DeliverPolicy.ALL
    return ConsumerConfig(
        name=durable,
        ack_wait=REDELIVERY_S[0],
        backoff=list(REDELIVERY_S),
        max_deliver=MAX_DELIVER + 1,
        max_ack_pending=MAX_ACK_PENDING,
        deliver_policy=policy,
    )


@dataclass
class Delivery(Generic[T]):
    """Takes each message of one consumer to ``handler``, in order (see the module doc)."""

    parse: Callable[[bytes], T]
    handler: Callable[[T], Awaitable[None]]
    claim: Claim[T] | None
    dead_letter: DeadLetterSink
    outage: Outage
    refused: Callable[[], None]
    batch: Batch[T] | None = None
    metrics: ConsumerMetrics | None = None  # lag and redeliveries, where the service has them
    _held: dict[int, Received] = field(default_factory=dict)  # by id: received, not finished
    _queue: asyncio.Queue[Received] = field(default_factory=asyncio.Queue)
    _handled: Handled = field(default_factory=Handled)
    _gap: LaneGap = field(default_factory=LaneGap)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work()), asyncio.create_task(self._keep())]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks, what="bus delivery")

    async def receive(self, msg: Received) -> None:
        """The subscription's callback: returns at once, so every held message is ours to
        keep alive."""
        self._held[id(msg)] = msg
        self._queue.put_nowait(msg)
        if self.metrics is not None:
            behind = msg.metadata.num_pending if msg.metadata else None
            self.metrics.received(0 if is_lane(msg) else _deliveries(msg), behind, len(self._held))

    async def by_lane(self, msg: Msg) -> None:
        """The fast lane's callback (:mod:`unicron.shared.bus.lane`)."""
        await self.receive(LaneMsg.of(msg))

    async def _work(self) -> None:
        while True:
            msgs = [await self._queue.get()]
            while self.batch is not None and not self._queue.empty():
                msgs.append(self._queue.get_nowait())
            try:
                await self.on_messages(msgs)
            except Exception:  # the connection went away mid-ack: the server redelivers
                log.warning("messages left unacked", subject=msgs[0].subject, exc_info=True)
            finally:
                for msg in msgs:
                    self._held.pop(id(msg), None)
                if self.metrics is not None:
                    self.metrics.settled(len(self._held))

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(KEEP_ALIVE_S)
            for msg in list(self._held.values()):
                with contextlib.suppress(Exception):  # NATS may be the one that is away
                    await msg.in_progress()

    async def on_messages(self, msgs: list[Received]) -> None:
        admitted = []
        for msg in await self._unseen(msgs):
            if self._lane_shut(msg):
                continue
            if one := await self._admit(msg):
                admitted.append(one)
        if len(admitted) > 1 and self.batch is not None:
            batch = self.batch
            try:
                await self._through_outage(lambda: batch([item for _, item in admitted]))
            except Exception as exc:
                if is_outage(exc):  # held as long as one message would be: hand them back
                    for msg, _ in admitted:
                        await self._failed(msg, exc)
                    return
                log.warning("batch failed; handling its messages one by one", error=repr(exc))
            else:
                self.outage.ok()
                for msg, _ in admitted:
                    await self._done(msg)
                return
        for msg, item in admitted:
            await self._handle(msg, item)

    async def _unseen(self, msgs: list[Received]) -> list[Received]:
        """``msgs`` without the copies of messages already handled (a stream copy of one is
        acknowledged); a message whose two copies are both here is its stream copy (the record,
        to acknowledge), in the place of the copy that came first: moved to where the stream
        copy came, a lane copy after it (a rank's exit) would overtake it (its last step)."""
        stored = {message_id(m): m for m in msgs if not is_lane(m)}
        stored.pop(None, None)
        fresh, placed = [], set()
        for msg in msgs:
            msg_id = message_id(msg)
            if msg_id in self._handled:
                await msg.ack()
            elif msg_id not in stored:
                fresh.append(msg)
            elif msg_id not in placed:
                placed.add(msg_id)
                fresh.append(stored[msg_id])
        return fresh

    def _lane_shut(self, msg: Received) -> bool:
        """Whether ``msg`` is a lane copy to pass over (it then keeps the lane shut too)."""
        if not is_lane(msg) or not self._gap.shut():
            return False
        self._not_handled(msg, "the lane is shut until a stream copy before it is settled")
        return True

    async def _done(self, msg: Received) -> None:
        await msg.ack()
        self._handled.add(message_id(msg))
        self._gap.settled(message_id(msg))

    def _not_handled(self, msg: Received, why: object) -> None:
        """A lane copy its stream copy will stand in for: the lane shuts until then."""
        log.debug("lane copy not handled", subject=msg.subject, error=repr(why))
        self._gap.open(message_id(msg))

    async def _admit(self, msg: Received) -> tuple[Received, T] | None:
        """The message and what it parsed to, if it parses and its claims hold; else it is
        dead-lettered (or handed back, when the check failed for another reason)."""
        try:
            item = self.parse(msg.data)
        except PARSE_ERRORS as exc:
            await self._reject(msg, f"invalid message: {exc}")
            return None
        claim = self.claim
        if claim is None:
            return msg, item
        try:
            await self._through_outage(lambda: claim(msg.subject, item))
        except Exception as exc:
            await self._refuse_or_fail(msg, exc)
            return None
        return msg, item

    async def _handle(self, msg: Received, item: T) -> None:
        if self._lane_shut(msg):  # one before it in this batch was not handled
            return
        try:
            await self._through_outage(lambda: self.handler(item))
        except Exception as exc:
            await self._refuse_or_fail(msg, exc)
            return
        self.outage.ok()
        await self._done(msg)

    async def _refuse_or_fail(self, msg: Received, exc: Exception) -> None:
        if is_lane(msg):  # its stream copy is refused, retried or dead-lettered instead
            self._not_handled(msg, exc)
            return
        if isinstance(exc, ClaimRefusedError):
            self.refused()
            await self._reject(msg, f"refused: {exc}")
        else:
            await self._failed(msg, exc)

    async def _reject(self, msg: Received, reason: str) -> None:
        if is_lane(msg):
            self._not_handled(msg, reason)
            return
        await self.dead_letter(msg.subject, msg.data, reason, _deliveries(msg))
        await msg.term()
        self._gap.settled(message_id(msg))

    async def _failed(self, msg: Received, exc: Exception) -> None:
        deliveries = _deliveries(msg)
        if is_outage(exc):  # still away: hand it back for later, without a traceback
            with contextlib.suppress(Exception):
                await msg.nak(delay=self.outage.delay())
        elif deliveries >= MAX_DELIVER:
            await self._reject(msg, f"handler failed: {exc!r}")
        else:
            log.exception("handler failed; will retry", subject=msg.subject)
            await msg.nak(delay=0.5 * deliveries)

    async def _through_outage(self, step: Callable[[], Awaitable[None]]) -> None:
        """Run ``step`` (a claim check or a handler), retrying in place while Redis or NATS is
        away: redeliveries would spend the message's few deliveries on an outage that is not
        its fault, and holding it keeps its order too."""
        deadline = time.monotonic() + OUTAGE_HOLD_S
        while True:
            try:
                await step()
                return
            except Exception as exc:
                if not is_outage(exc) or time.monotonic() >= deadline:
                    raise
                self.outage.failed(exc)
            await self.outage.pause()


def _deliveries(msg: Received) -> int:
    return msg.metadata.num_delivered if msg.metadata else 1
