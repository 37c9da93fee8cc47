"""The NATS server of :class:`tests.twins.memorybus.MemoryBus`, for unit tests only: streams,
durable consumers and core request/reply in memory.

A durable hands each message of its stream that its filter matches to one of its bound
consumers, in stream order, and keeps it until acked or terminated: one nak'd comes back after
the delay the nak asked for, with its delivery count raised, up to ``max_deliver`` as
:func:`unicron.shared.bus.delivery.consumer_config` sets it; one held by a consumer that goes away
comes back to the next consumer bound. Nothing expires and nothing is redelivered for want of an
ack.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from unicron.shared.bus.delivery import MAX_DELIVER
from unicron.shared.bus.lane import MSG_ID
from unicron.shared.bus.streams import STREAMS
from unicron.shared.logging import get_logger

DUPLICATE_WINDOW_S = 120.0  # JetStream's default
Receive = Callable[[Msg], Awaitable[None]]
log = get_logger(component="bus")


def matches(pattern: str, subject: str) -> bool:
    """Whether NATS routes ``subject`` to ``pattern`` (``*`` one token, ``>`` the rest); a
    wildcard in ``subject`` (a consumer's filter) is matched as a token like any other."""
    want, got = pattern.split("."), subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(got) > index
        if index >= len(got) or token not in ("*", got[index]):
            return False
    return len(want) == len(got)


@dataclass(frozen=True)
class Stored:
    subject: str
    data: bytes
    msg_id: str | None = None


@dataclass(frozen=True)
class Metadata:
    num_delivered: int
    num_pending: int = 0  # not counted here: a consumer's lag reads as what it holds


class _Background:
    """Tasks the broker starts on its own (a redelivery, a ping's callback), kept referenced."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Awaitable[Any]) -> None:
        async def run() -> None:
            await work

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        # A ping's callback that raises answers nothing, as on NATS: the request times out.
        if not task.cancelled() and task.exception() is not None:
            log.warning("memory broker task failed", error=repr(task.exception()))


class JetStreamMsg:
    """What :class:`unicron.shared.bus.delivery.Delivery` uses of a ``nats.aio.msg.Msg``."""

    def __init__(self, durable: Durable, seq: int, delivered: int) -> None:
        stored = durable.stream.log[seq - 1]
        self.durable, self.seq = durable, seq
        self.subject, self.data = stored.subject, stored.data
        self.headers = None if stored.msg_id is None else {MSG_ID: stored.msg_id}
        self.metadata = Metadata(delivered)

    async def ack(self) -> None:
        self.durable.finish(self)

    async def term(self) -> None:
        self.durable.finish(self)

    async def nak(self, delay: float | None = None) -> None:
        self.durable.hand_back(self, delay or 0.0)

    async def in_progress(self) -> None:
        """Nothing to extend: no ack wait runs out here."""


class Durable:
    def __init__(self, stream: Stream, subject: str, start: int) -> None:
        self.stream, self.subject = stream, subject
        self.cursor = start  # the next stream sequence to consider
        self.receivers: list[Receive] = []
        self.again: deque[tuple[int, int]] = deque()  # (sequence, delivery) to hand out again
        self.held: dict[int, tuple[JetStreamMsg, Receive]] = {}
        self._turn = 0

    async def bind(self, receive: Receive) -> None:
        self.receivers.append(receive)
        await self.pump()

    async def unbind(self, receive: Receive) -> None:
        self.receivers.remove(receive)
        for seq, (msg, holder) in sorted(self.held.items()):
            if holder == receive:  # bound methods: equal, not identical
                del self.held[seq]
                self.again.append((seq, msg.metadata.num_delivered + 1))
        await self.pump()

    async def pump(self) -> None:
        while self.receivers:
            item = self._next()
            if item is None:
                return
            receive = self.receivers[self._turn % len(self.receivers)]
            self._turn += 1
            msg = JetStreamMsg(self, *item)
            self.held[msg.seq] = (msg, receive)
            # Delivery takes the memory message for a nats Msg: it uses only what both have.
            await receive(cast(Msg, msg))

    def _next(self) -> tuple[int, int] | None:
        if self.again:
            return self.again.popleft()
        while self.cursor <= len(self.stream.log):
            seq, self.cursor = self.cursor, self.cursor + 1
            if matches(self.subject, self.stream.log[seq - 1].subject):
                return seq, 1
        return None

    def finish(self, msg: JetStreamMsg) -> None:
        if self.held.get(msg.seq, (None,))[0] is msg:
            del self.held[msg.seq]

    def hand_back(self, msg: JetStreamMsg, delay_s: float) -> None:
        if self.held.get(msg.seq, (None,))[0] is not msg:
            return  # handed back already (its consumer went away)
        del self.held[msg.seq]
        if msg.metadata.num_delivered >= MAX_DELIVER + 1:  # the consumer's max_deliver
            return
        asyncio.get_running_loop().call_later(
            delay_s, self._again, msg.seq, msg.metadata.num_delivered + 1
        )

    def _again(self, seq: int, delivered: int) -> None:
        self.again.append((seq, delivered))
        self.stream.background.spawn(self.pump())


@dataclass
class Stream:
    name: str
    subjects: list[str]
    background: _Background
    log: list[Stored] = field(default_factory=list)  # sequence n is log[n - 1]
    durables: list[Durable] = field(default_factory=list)
    grown: asyncio.Event = field(default_factory=asyncio.Event)  # replaced on each append
    _seen: dict[str, float] = field(default_factory=dict)  # message id → when

    def holds(self, subject: str) -> bool:
        return any(matches(pattern, subject) for pattern in self.subjects)

    async def append(self, subject: str, data: bytes, msg_id: str | None) -> None:
        at = time.monotonic()
        if msg_id is not None:
            if at - self._seen.get(msg_id, -DUPLICATE_WINDOW_S) < DUPLICATE_WINDOW_S:
                return  # a duplicate: acknowledged, not stored
            self._seen[msg_id] = at
        self.log.append(Stored(subject, data, msg_id))
        grown, self.grown = self.grown, asyncio.Event()
        grown.set()
        for durable in self.durables:
            await durable.pump()


class MemoryBroker:
    """The "server" that several :class:`tests.twins.memorybus.MemoryBus` clients share."""

    def __init__(self) -> None:
        self.background = _Background()
        self.streams = {
            name: Stream(name, subjects, self.background) for name, subjects in STREAMS.items()
        }
        self.durables: dict[str, Durable] = {}
        self.core: list[CoreSubscription] = []
        self.packages: dict[str, bytes] = {}  # the packages' object store, by sha256

    def stream_of(self, subject: str) -> Stream | None:
        return next((s for s in self.streams.values() if s.holds(subject)), None)

    def durable(self, name: str, subject: str, deliver_new: bool) -> Durable:
        """The durable ``name``, created on ``subject``'s stream the first time."""
        if name not in self.durables:
            stream = self.stream_of(subject)
            if stream is None:
                raise NoRespondersError
            start = len(stream.log) + 1 if deliver_new else 1
            self.durables[name] = Durable(stream, subject, start)
            stream.durables.append(self.durables[name])
        return self.durables[name]


@dataclass
class CoreReply:
    data: bytes


@dataclass
class CoreMsg:
    subject: str
    data: bytes
    reply: str
    answered: asyncio.Future[CoreReply]

    async def respond(self, data: bytes) -> None:
        if not self.answered.done():  # the first answer wins, as with NATS
            self.answered.set_result(CoreReply(data))


@dataclass
class CoreSubscription:
    broker: MemoryBroker
    subject: str
    cb: Callable[[CoreMsg], Awaitable[None]]

    async def unsubscribe(self) -> None:
        if self in self.broker.core:
            self.broker.core.remove(self)


class MemoryCore:
    """The core-NATS part of a client (``Bus.nc``): subscriptions and requests."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self._subs: list[CoreSubscription] = []

    async def subscribe(
        self, subject: str, queue: str = "", cb: Callable[[CoreMsg], Awaitable[None]] | None = None
    ) -> CoreSubscription:
        if cb is None:
            raise ValueError("a memory subscription needs a callback")
        sub = CoreSubscription(self.broker, subject, cb)
        self.broker.core.append(sub)
        self._subs.append(sub)
        return sub

    # ``timeout`` is named as nats-py names it: callers pass it by keyword.
    async def request(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float = 0.5,  # noqa: ASYNC109
    ) -> CoreReply:
        listeners = [s for s in self.broker.core if matches(s.subject, subject)]
        if not listeners:
            raise NoRespondersError
        answered: asyncio.Future[CoreReply] = asyncio.get_running_loop().create_future()
        for sub in listeners:
            self.broker.background.spawn(sub.cb(CoreMsg(subject, payload, "_INBOX", answered)))
        try:
            return await asyncio.wait_for(answered, timeout)
        except TimeoutError:
            raise NatsTimeoutError from None

    async def close(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs.clear()
