"""The bus's public face: what a service needs of the bus, whichever transport carries it.

:class:`unicron.shared.bus.bus.Bus` (NATS JetStream) is one; the in-memory twin of the tests
(``tests/twins/memorybus.py``) is another, so one test body checks a service on both
(docs/design.md §6). A service holds an :class:`EventBus`, never the client underneath (``nc``,
``js``). It is a base class, not a protocol, because both buses wrap, de-duplicate,
dead-letter and deliver a message the same way; each adds its transport.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from unicron.shared.bus.delivery import Batch, Claim, Delivery
from unicron.shared.contracts.events import CloudEvent, EventData
from unicron.shared.contracts.messages import (
    DEADLETTER_SUBJECT,
    AnyAgentCommand,
    DeadLetter,
    command_subject,
)
from unicron.shared.contracts.reports import AnyReport, report_id, report_subject
from unicron.shared.logging import get_logger
from unicron.shared.metrics import ServiceMetrics
from unicron.shared.outage import Outage

T = TypeVar("T")
log = get_logger(component="bus")


@dataclass(frozen=True)
class Outgoing:
    """A message made once and sent as often as it takes: its subject, its bytes and its id
    (None: a message NATS does not de-duplicate and the lane does not carry)."""

    subject: str
    payload: bytes
    msg_id: str | None = None
    what: str = ""  # its kind, for logs


def report_message(report: AnyReport) -> Outgoing:
    payload = report.model_dump_json().encode()
    return Outgoing(report_subject(report), payload, report_id(report), report.kind)


def command_message(node_id: str, command: AnyAgentCommand) -> Outgoing:
    payload = command.model_dump_json().encode()
    return Outgoing(command_subject(node_id), payload, command.command_id, type(command).__name__)


def event_message(event: CloudEvent) -> Outgoing:
    return Outgoing(event.nats_subject, event.model_dump_json().encode(), event.id, event.type)


class EventBus(ABC):
    """Publishing with de-duplication and durable, at-least-once consumers
    (:mod:`unicron.shared.bus.bus`)."""

    def __init__(self, source: str, metrics: ServiceMetrics | None = None) -> None:
        self.source = source
        # The service's registry: shared by the connections of its terms (shared/metrics.py).
        self.metrics = metrics or ServiceMetrics()
        self.refused = 0  # messages a claim check refused, since start
        # One tracker for every handler: a Redis outage fails them all at once.
        self.handler_outage = Outage("bus handlers", component="bus", source=source)

    @property
    @abstractmethod
    def connected(self) -> bool:
        """Whether the bus can publish now (not while its client reconnects)."""

    @abstractmethod
    async def close(self) -> None: ...

    # --- publishing ----------------------------------------------------------------------

    @abstractmethod
    async def _publish(self, subject: str, payload: bytes, msg_id: str | None = None) -> None:
        """Store ``payload`` in the stream of ``subject``, once per ``msg_id``."""

    async def send(self, message: Outgoing) -> None:
        await self._publish(message.subject, message.payload, message.msg_id)

    def wrap(self, data: EventData, event_id: str | None = None) -> CloudEvent:
        return CloudEvent.wrap(data, self.source, event_id)

    async def publish_event(self, data: EventData, event_id: str | None = None) -> CloudEvent:
        event = self.wrap(data, event_id)
        await self.send(event_message(event))
        log.debug("event published", type=event.type, id=event.id)
        self.metrics.published(data)
        return event

    async def send_command(self, node_id: str, command: AnyAgentCommand) -> None:
        await self.send(command_message(node_id, command))

    @abstractmethod
    async def lane_ahead(self, messages: Sequence[Outgoing]) -> None:
        """Deliver ``messages`` now and in order, before they are stored one after another
        (:mod:`unicron.shared.bus.lane`); those without an id are left to their storing."""

    async def publish_report(self, report: AnyReport) -> None:
        await self.send(report_message(report))

    def dead_letter_message(
        self, subject: str, payload: bytes, reason: str, deliveries: int
    ) -> Outgoing:
        """The dead letter of a message (logged now: it is made once, however often sent)."""
        log.warning("message dead-lettered", subject=subject, reason=reason)
        self.metrics.dead_lettered(self.source)
        letter = DeadLetter(
            subject=subject,
            reason=reason,
            payload=payload.decode("utf-8", "replace"),
            service=self.source,
            deliveries=deliveries,
        )
        return Outgoing(DEADLETTER_SUBJECT, letter.model_dump_json().encode(), what="dead_letter")

    async def dead_letter(self, subject: str, payload: bytes, reason: str, deliveries: int) -> None:
        await self.send(self.dead_letter_message(subject, payload, reason, deliveries))

    # --- request/reply, objects and stored messages ----------------------------------------

    @abstractmethod
    async def serve(self, subject: str, answer: Callable[[bytes], Awaitable[bytes]]) -> None:
        """Answer each core request on ``subject`` with what ``answer`` makes of its payload."""

    @abstractmethod
    async def request(self, subject: str, payload: bytes, timeout_s: float) -> bytes:
        """A core request's answer: ``nats.errors.NoRespondersError`` when nobody listens on
        the subject, ``nats.errors.TimeoutError`` when nobody answers in time."""

    @abstractmethod
    async def package(self, sha256: str) -> bytes:
        """A job package's bytes; ``PackageError`` when absent or altered."""

    @abstractmethod
    async def has_package(self, sha256: str) -> bool: ...

    @abstractmethod
    async def put_package(self, data: bytes) -> tuple[str, bool]:
        """Store ``data`` under its sha256; (sha256, whether it was new)."""

    @abstractmethod
    async def last_event_seq(self) -> int:
        """The stream sequence of the latest stored event; 0 when there is none."""

    @abstractmethod
    def read_stream(self, stream: str, subjects: list[str]) -> AsyncIterator[tuple[str, bytes]]:
        """(subject, payload) of every message of ``stream`` on ``subjects`` up to its end,
        oldest first."""

    @abstractmethod
    async def last_message(self, stream: str, subject: str) -> bytes | None:
        """The payload of the latest message of ``stream`` on ``subject``; None if none."""

    # --- consuming -----------------------------------------------------------------------

    async def consume(
        self,
        subject: str,
        durable: str,
        parse: Callable[[bytes], T],
        handler: Callable[[T], Awaitable[None]],
        deliver_new: bool = False,
        claim: Claim[T] | None = None,
        batch: Batch[T] | None = None,
    ) -> None:
        """Feed every message on ``subject`` to ``handler`` in order, acking after success
        (:mod:`unicron.shared.bus.delivery`).

        ``claim(subject, item)`` runs first and raises ``ClaimRefusedError`` for a message the
        state contradicts: that one is dead-lettered, counted in ``refused``, and not handled.
        With ``batch``, the messages that queued up meanwhile go to it together, in order.
        """
        delivery = Delivery(
            parse, handler, claim, self.dead_letter, self.handler_outage, self._count_refused,
            batch, self.metrics.consumer(durable),
        )  # fmt: skip
        await self._bind(subject, durable, deliver_new, delivery)

    @abstractmethod
    async def _bind(
        self, subject: str, durable: str, deliver_new: bool, delivery: Delivery[Any]
    ) -> None:
        """Start ``delivery`` and hand it the messages of the durable consumer ``durable``."""

    def _count_refused(self) -> None:
        self.refused += 1

    @abstractmethod
    def tail_events(
        self, after_seq: int | None = None
    ) -> AsyncGenerator[tuple[int, CloudEvent], None]:
        """Yield (stream sequence, event): new events, or all after ``after_seq``."""
