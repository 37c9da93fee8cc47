"""The bus in memory, for unit tests only: :class:`MemoryBus` is a :class:`shared.ports.EventBus`
like :class:`shared.bus.Bus`, on a :class:`MemoryBroker` instead of a NATS server.

Faithful where tests depend on it: the same streams and subjects, publishing de-duplicated by
message id within JetStream's window, durable consumers shared by every bus of the broker that
names them (a restarted consumer resumes where its durable left off), each message delivered in
order and at least once, and the per-message logic itself — parse, claim check, handler, ack,
dead letter — is :class:`shared.delivery.Delivery`'s, so ``PARSE_ERRORS`` and
``ClaimRefusedError`` mean what they mean on NATS. Core request/reply (``nc``) is there for
pings. Not modelled: ack waits (a live consumer keeps its messages anyway), stream limits, ages.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from nats.errors import NoRespondersError

from unicron.shared.bus import parse_event
from unicron.shared.delivery import PARSE_ERRORS, Claim, Delivery
from unicron.shared.events import CloudEvent, EventData
from unicron.shared.logging import get_logger
from unicron.shared.memorybroker import Durable, MemoryBroker, MemoryCore, Receive
from unicron.shared.messages import DEADLETTER_SUBJECT, AnyAgentCommand, DeadLetter, command_subject
from unicron.shared.outage import Outage
from unicron.shared.packages import PackageError
from unicron.shared.ports import EventBus
from unicron.shared.reports import AnyWorkerReport, report_id, report_subject

T = TypeVar("T")
log = get_logger(component="bus")

__all__ = ["MemoryBroker", "MemoryBus"]


class MemoryBus:
    def __init__(self, broker: MemoryBroker, source: str) -> None:
        self.broker = broker
        self.source = source
        self.nc = MemoryCore(broker)
        self.refused = 0  # messages a claim check refused, since start
        self.handler_outage = Outage("bus handlers", component="bus", source=source)
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

    async def publish_event(self, data: EventData, event_id: str | None = None) -> CloudEvent:
        event = CloudEvent.wrap(data, self.source, event_id)
        await self._publish(event.nats_subject, event.model_dump_json().encode(), event.id)
        return event

    async def send_command(self, node_id: str, command: AnyAgentCommand) -> None:
        payload = command.model_dump_json().encode()
        await self._publish(command_subject(node_id), payload, command.command_id)

    async def publish_report(self, report: AnyWorkerReport) -> None:
        payload = report.model_dump_json().encode()
        await self._publish(report_subject(report), payload, report_id(report))

    async def dead_letter(self, subject: str, payload: bytes, reason: str, deliveries: int) -> None:
        letter = DeadLetter(
            subject=subject,
            reason=reason,
            payload=payload.decode("utf-8", "replace"),
            service=self.source,
            deliveries=deliveries,
        )
        log.warning("message dead-lettered", subject=subject, reason=reason)
        await self._publish(DEADLETTER_SUBJECT, letter.model_dump_json().encode())

    # --- request/reply and objects -------------------------------------------------------

    async def serve(self, subject: str, answer: Callable[[bytes], Awaitable[bytes]]) -> None:
        async def respond(msg: Any) -> None:
            await msg.respond(await answer(msg.data))

        await self.nc.subscribe(subject, cb=respond)

    async def package(self, sha256: str) -> bytes:
        try:
            return self.broker.packages[sha256]
        except KeyError:
            raise PackageError(f"package {sha256} is not in the store") from None

    # --- consuming -----------------------------------------------------------------------

    async def consume(
        self,
        subject: str,
        durable: str,
        parse: Callable[[bytes], T],
        handler: Callable[[T], Awaitable[None]],
        deliver_new: bool = False,
        claim: Claim[T] | None = None,
    ) -> None:
        delivery = Delivery(
            parse, handler, claim, self.dead_letter, self.handler_outage, self._count_refused
        )
        consumer = self.broker.durable(durable, subject, deliver_new)
        delivery.start()
        self._bound.append((consumer, delivery.receive, delivery))
        await consumer.bind(delivery.receive)

    def _count_refused(self) -> None:
        self.refused += 1

    async def tail_events(
        self, after_seq: int | None = None
    ) -> AsyncGenerator[tuple[int, CloudEvent], None]:
        """Yield (stream sequence, event): new events, or all after ``after_seq``."""
        stream = self.broker.streams["UNICRON_EVENTS"]
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


if TYPE_CHECKING:  # mypy checks here that the memory bus keeps to the protocol
    _CONFORMS: type[EventBus] = MemoryBus
