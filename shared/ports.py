"""What a service needs of the bus and of the state store, as protocols.

:class:`shared.bus.Bus` (NATS JetStream) and :class:`shared.state.StateStore` (Redis) satisfy
them, and so do the in-memory :class:`shared.memorybus.MemoryBus` and
:class:`shared.memorystore.MemoryStore`, which are for unit tests only: a service annotated with
these protocols runs on either, so one test body can check it on both (docs/design.md §6).

The protocols hold what services call, never the clients underneath (``js``, ``redis``): a
service that needs one of those still takes the concrete class. The one exception is ``nc``,
narrowed to the core-NATS request the detector's ping and the API's log fetch make, until the
bus offers a request of its own.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Protocol, TypeVar

from unicron.shared.delivery import Claim
from unicron.shared.events import CloudEvent, EventData
from unicron.shared.jobindex import JobPosition
from unicron.shared.messages import AnyAgentCommand
from unicron.shared.models import Job, NodeRecord
from unicron.shared.plans import Plan
from unicron.shared.records import Mutation
from unicron.shared.reports import AnyWorkerReport

T = TypeVar("T")


class Reply(Protocol):
    @property
    def data(self) -> bytes: ...


class CoreRequests(Protocol):
    """A core-NATS request: ``nats.errors.NoRespondersError`` when nobody listens on the
    subject, ``nats.errors.TimeoutError`` when nobody answers in time."""

    # ``timeout`` as nats-py names it: callers pass it by keyword.
    async def request(
        self,
        subject: str,
        payload: bytes = ...,
        timeout: float = ...,  # noqa: ASYNC109
    ) -> Reply: ...


class EventBus(Protocol):
    """Publishing with de-duplication and durable, at-least-once consumers (:mod:`shared.bus`)."""

    @property
    def nc(self) -> CoreRequests: ...

    @property
    def connected(self) -> bool: ...

    async def close(self) -> None: ...

    async def publish_event(self, data: EventData, event_id: str | None = None) -> CloudEvent: ...

    async def send_command(self, node_id: str, command: AnyAgentCommand) -> None: ...

    async def publish_report(self, report: AnyWorkerReport) -> None: ...

    async def dead_letter(
        self, subject: str, payload: bytes, reason: str, deliveries: int
    ) -> None: ...

    async def serve(self, subject: str, answer: Callable[[bytes], Awaitable[bytes]]) -> None: ...

    async def package(self, sha256: str) -> bytes: ...

    async def consume(
        self,
        subject: str,
        durable: str,
        parse: Callable[[bytes], T],
        handler: Callable[[T], Awaitable[None]],
        deliver_new: bool = False,
        claim: Claim[T] | None = None,
    ) -> None: ...

    def tail_events(
        self, after_seq: int | None = None
    ) -> AsyncGenerator[tuple[int, CloudEvent], None]: ...


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
