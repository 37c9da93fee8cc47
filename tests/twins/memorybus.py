"""The bus in memory, for unit tests only: :class:`MemoryBus` is a
:class:`unicron.shared.bus.api.EventBus` like :class:`unicron.shared.bus.bus.Bus`, on a
:class:`MemoryBroker` instead of a NATS server.

Faithful where tests depend on it: the same streams and subjects, publishing de-duplicated by
message id within JetStream's window, durable consumers shared by every bus of the broker that
names them (a restarted consumer resumes where its durable left off), each message delivered in
order and at least once, and the per-message logic itself — parse, claim check, handler, ack,
dead letter — is :class:`unicron.shared.bus.delivery.Delivery`'s, so ``PARSE_ERRORS`` and
``ClaimRefusedError`` mean what they mean on NATS. Core request/reply (``nc``) is there for
pings. Not modelled: ack waits (a live consumer keeps its messages anyway), stream limits, ages.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from nats.errors import NoRespondersError
from unicron.shared.bus.api import EventBus, Outgoing
from unicron.shared.bus.bus import parse_event
from unicron.shared.bus.delivery import PARSE_ERRORS, Delivery
from unicron.shared.bus.packages import PackageError, sha256_hex
from unicron.shared.bus.streams import EVENTS_STREAM
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.logging import get_logger

from tests.twins.memorybroker import Durable, MemoryBroker, MemoryCore, Receive, matches

log = get_logger(component="bus")

__all__ = ["MemoryBroker", "MemoryBus"]


class MemoryBus(EventBus):
    def __init__(self, broker: MemoryBroker, source: str) -> None:
        super().__init__(source)
        self.broker = broker
        self.nc = MemoryCore(broker)
        self._bound: list[tuple[Durable, Receive, Delivery[Any]]] = []
        self._open = True

    @property
    def connected(self) -> bool:
        return self._open

    async def close(self) -> None:
        self._open = False
        await self.nc.close()
        for durable, receive, delivery in self._bound:  # what they held, the durable keeps
            await durable.unbind(receive)
            await delivery.stop()
        self._bound.clear()

    # --- publishing ----------------------------------------------------------------------

    async def _publish(self, subject: str, payload: bytes, msg_id: str | None = None) -> None:
        stream = self.broker.stream_of(subject)
        if stream is None:
            raise NoRespondersError
        await stream.append(subject, payload, msg_id)

    # --- request/reply and objects -------------------------------------------------------

    async def serve(self, subject: str, answer: Callable[[bytes], Awaitable[bytes]]) -> None:
        async def respond(msg: Any) -> None:
            await msg.respond(await answer(msg.data))

        await self.nc.subscribe(subject, cb=respond)

    async def request(self, subject: str, payload: bytes, timeout_s: float) -> bytes:
        return (await self.nc.request(subject, payload, timeout=timeout_s)).data

    async def package(self, sha256: str) -> bytes:
        try:
            return self.broker.packages[sha256]
        except KeyError:
            raise PackageError(f"package {sha256} is not in the store") from None

    async def has_package(self, sha256: str) -> bool:
        return sha256 in self.broker.packages

    async def put_package(self, data: bytes) -> tuple[str, bool]:
        sha256 = sha256_hex(data)
        created = sha256 not in self.broker.packages
        self.broker.packages[sha256] = data
        return sha256, created

    # --- stored messages -----------------------------------------------------------------

    async def last_event_seq(self) -> int:
        return len(self.broker.streams[EVENTS_STREAM].log)

    async def read_stream(
        self, stream: str, subjects: list[str]
    ) -> AsyncIterator[tuple[str, bytes]]:
        stored = list(self.broker.streams[stream].log)  # up to its end now
        for message in stored:
            if any(matches(pattern, message.subject) for pattern in subjects):
                yield message.subject, message.data

    async def last_message(self, stream: str, subject: str) -> bytes | None:
        log = self.broker.streams[stream].log
        found = (m.data for m in reversed(log) if matches(subject, m.subject))
        return next(found, None)

    # --- consuming -----------------------------------------------------------------------

    async def lane_ahead(self, messages: Sequence[Outgoing]) -> None:
        """No fast lane in memory: nothing stalls storing, messages arrive as they are stored."""

    async def _bind(
        self, subject: str, durable: str, deliver_new: bool, delivery: Delivery[Any]
    ) -> None:
        consumer = self.broker.durable(durable, subject, deliver_new)
        delivery.start()
        self._bound.append((consumer, delivery.receive, delivery))
        await consumer.bind(delivery.receive)

    async def tail_events(
        self, after_seq: int | None = None
    ) -> AsyncGenerator[tuple[int, CloudEvent], None]:
        stream = self.broker.streams[EVENTS_STREAM]
        seq = len(stream.log) if after_seq is None else after_seq
        while True:
            grown = stream.grown
            while seq < len(stream.log):
                seq += 1
                try:
                    yield seq, parse_event(stream.log[seq - 1].data)
                except PARSE_ERRORS:
                    log.warning("skipping malformed event", seq=seq)
            await grown.wait()
