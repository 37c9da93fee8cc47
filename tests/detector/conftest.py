"""An in-process detector fed with the reports agents would send, on two backends: the
in-memory bus and store (:mod:`tests.twins.memorybus`, :mod:`tests.twins.memorystore`) and real NATS
+ Redis. Every test that uses the bus or the state runs on both (ids ``memory`` and ``real``),
except those in ``REAL_ONLY``, which need a real server by nature."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import pytest
from unicron.services.detector.service import run
from unicron.services.detector.settings import DetectorSettings
from unicron.shared.bus.api import EventBus
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.messages import ping_subject
from unicron.shared.contracts.models import (
    Job,
    JobSpec,
    JobState,
    NodeRecord,
    WorkerRecord,
    WorkerState,
    now,
)
from unicron.shared.store.api import JobStore
from unicron.shared.store.state import StateStore

from tests.twins.memorybus import MemoryBroker, MemoryBus
from tests.twins.memorystore import MemoryKeys, MemoryStore

# Test name → why its memory run is skipped.
REAL_ONLY = {
    "test_silence_while_redis_was_away_is_no_nodes_fault": "it stops and restarts Redis",
}


@dataclass
class Backend:
    """Where a test's clients connect: one broker and one keyspace in memory, or the real
    servers at the URLs. Several clients of one backend share its state, as with servers."""

    name: str
    nats_url: str = "nats://in-memory"
    redis_url: str = "redis://in-memory"
    broker: MemoryBroker = field(default_factory=MemoryBroker)
    keys: MemoryKeys = field(default_factory=MemoryKeys)

    async def bus(self, source: str) -> EventBus:
        if self.name == "memory":
            return MemoryBus(self.broker, source)
        return await Bus.connect(self.nats_url, source=source)

    async def store(self) -> JobStore:
        if self.name == "memory":
            return MemoryStore(self.keys)
        return await StateStore.connect(self.redis_url)


@pytest.fixture(params=["memory", "real"])
def backend_name(request: pytest.FixtureRequest) -> str:
    why = REAL_ONLY.get(request.node.originalname)
    if request.param == "memory" and why is not None:
        pytest.skip(f"real servers only: {why}")
    return str(request.param)


@pytest.fixture
def nats_url(backend_name: str, request: pytest.FixtureRequest) -> str:
    """The real server's URL; no server is started for a memory run."""
    if backend_name == "memory":
        return Backend.nats_url
    return str(request.getfixturevalue("nats_server").url)


@pytest.fixture
def redis_url(backend_name: str, request: pytest.FixtureRequest) -> str:
    if backend_name == "memory":
        return Backend.redis_url
    return str(request.getfixturevalue("redis_server").url)


@pytest.fixture
def backend(backend_name: str, nats_url: str, redis_url: str) -> Backend:
    return Backend(backend_name, nats_url, redis_url)


@pytest.fixture
async def bus(backend: Backend) -> AsyncIterator[EventBus]:
    connected = await backend.bus("unicron/test")
    yield connected
    await connected.close()


@pytest.fixture
async def state(backend: Backend) -> AsyncIterator[JobStore]:
    store = await backend.store()
    yield store
    await store.close()


@dataclass
class Cluster:
    """Nodes whose agents are alive (heartbeat + answer pings) until ``kill_agent``."""

    bus: EventBus
    state: JobStore
    alive: set[str] = field(default_factory=set)
    # Agents that live and answer, but whose heartbeats do not land (a blip between them and
    # Redis, or a write that loses its race again and again).
    unheard: set[str] = field(default_factory=set)

    async def add_node(self, node_id: str) -> None:
        await self.state.put_node(NodeRecord(id=node_id, slots=2, boot_id=f"boot-{node_id}"))
        self.alive.add(node_id)

        async def pong(msg: object) -> None:
            if node_id in self.alive:
                await msg.respond(f"boot-{node_id}".encode())  # type: ignore[attr-defined]

        # Not ``serve``: an answer from it cannot stop when the agent is killed.
        await self.bus.nc.subscribe(ping_subject(node_id), cb=pong)

    def kill_agent(self, node_id: str) -> None:
        self.alive.discard(node_id)

    async def heartbeat_forever(self) -> None:
        while True:
            for node_id in list(self.alive - self.unheard):

                def beat(node: NodeRecord) -> None:
                    node.last_heartbeat = now()

                await self.state.update_node(node_id, beat)
            await asyncio.sleep(0.2)

    async def add_job(
        self,
        job_id: str,
        placement: Iterable[str],
        generation: int = 1,
        spec: JobSpec | None = None,
        **fields: object,
    ) -> Job:
        workers = [
            WorkerRecord(rank=r, node_id=n, pid=1000 + r, state=WorkerState.RUNNING)
            for r, n in enumerate(placement)
        ]
        spec = spec or JobSpec(name=job_id)
        job = Job(
            id=job_id, name=job_id, spec=spec, state=JobState.RUNNING,
            generation=generation, world_size=len(workers), workers=workers, **fields,
        )  # fmt: skip
        await self.state.create_job(job)
        return job


@pytest.fixture
def detector_settings(nats_url: str, redis_url: str) -> DetectorSettings:
    return DetectorSettings(
        nats_url=nats_url,
        redis_url=redis_url,
        quarantine_cooldown_s=1.0,
        reconcile_interval_s=0.2,
    )


@pytest.fixture
async def cluster(
    backend: Backend, bus: EventBus, state: JobStore, detector_settings: DetectorSettings
) -> AsyncIterator[Cluster]:
    cluster = Cluster(bus, state)
    beating = asyncio.create_task(cluster.heartbeat_forever())
    detector_bus = await backend.bus("unicron/detector")
    detector_state = await backend.store()
    stop = asyncio.Event()
    detector = asyncio.create_task(run(detector_bus, detector_state, stop, detector_settings))
    yield cluster
    stop.set()
    await detector
    beating.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await beating
    await detector_bus.close()
    await detector_state.close()


@pytest.fixture
async def events(bus: EventBus) -> asyncio.Queue[CloudEvent]:
    queue: asyncio.Queue[CloudEvent] = asyncio.Queue()
    await bus.consume("unicron.events.>", "test-events", parse_event, queue.put)
    return queue


async def next_event(
    queue: asyncio.Queue[CloudEvent], kind: str, timeout_s: float = 5.0
) -> CloudEvent:
    """The next event of type ``kind``; fails after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while True:
            event = await queue.get()
            if event.type == kind:
                return event


async def no_event(queue: asyncio.Queue[CloudEvent], kind: str, within_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        event = await next_event(queue, kind, within_s)
        raise AssertionError(f"unexpected {kind}: {event.data}")
