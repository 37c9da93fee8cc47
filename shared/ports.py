"""What a service needs of the bus and of the state store.

:class:`shared.bus.Bus` (NATS JetStream) and :class:`shared.state.StateStore` (Redis) are
them, and so are the in-memory :class:`shared.memorybus.MemoryBus` and
:class:`shared.memorystore.MemoryStore`, which are for unit tests only: a service annotated with
these types runs on either, so one test body can check it on both (docs/design.md §6).

They hold what services call, never the clients underneath (``nc``, ``js``, ``redis``): those
belong to shared/. :class:`EventBus` is a base class, not a protocol, because both buses
wrap, de-duplicate, dead-letter and deliver a message the same way; each adds its transport.
:class:`JobStore` is a protocol: its two stores share no code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from unicron.shared.delivery import Claim, Delivery
from unicron.shared.events import CloudEvent, EventData
from unicron.shared.jobindex import JobPosition
from unicron.shared.logging import get_logger
from unicron.shared.messages import DEADLETTER_SUBJECT, AnyAgentCommand, DeadLetter, command_subject
from unicron.shared.models import Job, NodeRecord
from unicron.shared.outage import Outage
from unicron.shared.plans import Plan
from unicron.shared.records import Mutation
from unicron.shared.reports import AnyWorkerReport, report_id, report_subject

T = TypeVar("T")
log = get_logger(component="bus")


class EventBus(ABC):
    """Publishing with de-duplication and durable, at-least-once consumers (:mod:`shared.bus`)."""

    def __init__(self, source: str) -> None:
        self.source = source
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

    async def publish_event(self, data: EventData, event_id: str | None = None) -> CloudEvent:
        event = CloudEvent.wrap(data, self.source, event_id)
        await self._publish(event.nats_subject, event.model_dump_json().encode(), event.id)
        log.debug("event published", type=event.type, id=event.id)
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
    ) -> None:
        """Feed every message on ``subject`` to ``handler`` in order, acking after success
        (:mod:`shared.delivery`).

        ``claim(subject, item)`` runs first and raises ``ClaimRefusedError`` for a message the
        state contradicts: that one is dead-lettered, counted in ``refused``, and not handled.
        """
        delivery = Delivery(
            parse, handler, claim, self.dead_letter, self.handler_outage, self._count_refused
        )
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


class JobStore(Protocol):
    """Jobs, nodes, plans and guards, each record changed atomically (:mod:`shared.state`)."""

    async def close(self) -> None: ...

    async def ping(self) -> bool: ...

    async def once(self, key: str, ttl_s: int = 7 * 24 * 3600) -> bool: ...

    # --- jobs ------------------------------------------------------------------------------

    async def create_job(
        self, job: Job, idempotency_key: str | None = None
    ) -> tuple[Job, bool]: ...

    async def get_job(self, job_id: str) -> Job | None: ...

    async def list_jobs(self) -> list[Job]: ...

    async def update_job(self, job_id: str, mutate: Mutation[Job]) -> Job | None: ...

    async def index_after(
        self, position: JobPosition | None, offset: int, count: int
    ) -> list[JobPosition]: ...

    async def read_indexed(self, positions: list[JobPosition]) -> list[tuple[JobPosition, Job]]: ...

    # --- nodes and drills ------------------------------------------------------------------

    async def put_node(self, node: NodeRecord) -> None: ...

    async def get_node(self, node_id: str) -> NodeRecord | None: ...

    async def list_nodes(self) -> list[NodeRecord]: ...

    async def update_node(
        self, node_id: str, mutate: Mutation[NodeRecord]
    ) -> NodeRecord | None: ...

    async def record_node_failure(
        self, node_id: str, failure_id: str, at: float, window_s: float
    ) -> int: ...

    async def mark_drill(self, job_id: str, generation: int, fault_id: str, ttl_s: int) -> None: ...

    async def drill_of(self, job_id: str, generation: int) -> str | None: ...

    # --- plans, and the marker and counters of a rebuild -----------------------------------

    async def next_plan_seq(self) -> int: ...

    async def save_plan(self, plan: Plan) -> None: ...

    async def get_plan(self, plan_id: str) -> Plan | None: ...

    async def latest_plan(self) -> Plan | None: ...

    async def cluster_marker(self) -> str | None: ...

    async def mark_cluster(self, incarnation: str) -> bool: ...

    async def restore_job(self, job: Job) -> bool: ...

    async def raise_counter(self, key: str, floor: int) -> int: ...

    async def raise_plan_seq(self, floor: int) -> int: ...

    async def current_epoch(self, lease: str) -> int: ...
