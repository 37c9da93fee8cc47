"""An in-process detector on real NATS + Redis, fed with the reports agents would send."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import pytest

from unicron.services.detector.service import run
from unicron.services.detector.settings import DetectorSettings
from unicron.shared.bus import Bus, parse_event
from unicron.shared.events import CloudEvent
from unicron.shared.messages import ping_subject
from unicron.shared.models import Job, JobSpec, JobState, NodeRecord, WorkerRecord, WorkerState, now
from unicron.shared.state import StateStore


@dataclass
class Cluster:
    """Nodes whose agents are alive (heartbeat + answer pings) until ``kill_agent``."""

    bus: Bus
    state: StateStore
    alive: set[str] = field(default_factory=set)

    async def add_node(self, node_id: str) -> None:
        await self.state.put_node(NodeRecord(id=node_id, slots=2, boot_id=f"boot-{node_id}"))
        self.alive.add(node_id)

        async def pong(msg: object) -> None:
            if node_id in self.alive:
                await msg.respond(b"pong")  # type: ignore[attr-defined]

        await self.bus.nc.subscribe(ping_subject(node_id), cb=pong)

    def kill_agent(self, node_id: str) -> None:
        self.alive.discard(node_id)

    async def heartbeat_forever(self) -> None:
        while True:
            for node_id in list(self.alive):

                def beat(node: NodeRecord) -> None:
                    node.last_heartbeat = now()

                await self.state.update_node(node_id, beat)
            await asyncio.sleep(0.2)

    async def add_job(
        self, job_id: str, placement: Iterable[str], generation: int = 1, **fields: object
    ) -> Job:
        workers = [
            WorkerRecord(rank=r, node_id=n, pid=1000 + r, state=WorkerState.RUNNING)
            for r, n in enumerate(placement)
        ]
        job = Job(
            id=job_id, name=job_id, spec=JobSpec(name=job_id), state=JobState.RUNNING,
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
    bus: Bus, state: StateStore, nats_url: str, detector_settings: DetectorSettings
) -> AsyncIterator[Cluster]:
    cluster = Cluster(bus, state)
    beating = asyncio.create_task(cluster.heartbeat_forever())
    detector_bus = await Bus.connect(nats_url, source="unicron/detector")
    detector_state = await StateStore.connect(detector_settings.redis_url)
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
async def events(bus: Bus) -> asyncio.Queue[CloudEvent]:
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
