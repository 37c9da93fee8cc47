"""Planner processes and the cluster they plan, on each test's own NATS and Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.contracts.events import CloudEvent, PlanCreated
from unicron.shared.contracts.models import NodeRecord, now
from unicron.shared.store.state import StateStore

from tests.planner.live import Live, StartPlanner
from tests.services import service_processes

REPO = Path(__file__).resolve().parents[2]
NODES = ("node-a", "node-b")


@pytest.fixture
def start_planner(nats_url: str, redis_url: str, tmp_path: Path) -> Iterator[StartPlanner]:
    """Start ``python -m unicron.services.planner``; every one started is stopped at the end."""
    with service_processes("planner", nats_url, redis_url, tmp_path) as start:
        yield start


@pytest.fixture
async def nodes(state: StateStore) -> AsyncIterator[tuple[str, ...]]:
    """Two READY nodes of two slots whose heartbeats stay fresh while the test runs."""
    for node_id in NODES:
        await state.put_node(NodeRecord(id=node_id, slots=2))

    def beat(node: NodeRecord) -> None:
        node.last_heartbeat = now()

    async def heartbeats() -> None:
        while True:
            for node_id in NODES:
                await state.update_node(node_id, beat)
            await asyncio.sleep(0.5)

    task = asyncio.create_task(heartbeats())
    yield NODES
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.fixture
async def plans(bus: Bus) -> asyncio.Queue[PlanCreated]:
    queue: asyncio.Queue[PlanCreated] = asyncio.Queue()

    async def put(event: CloudEvent) -> None:
        data = event.typed()
        assert isinstance(data, PlanCreated)
        await queue.put(data)

    await bus.consume("unicron.events.plan.created", "test-plans", parse_event, put)
    return queue


@pytest.fixture
def live(
    start_planner: StartPlanner,
    nodes: tuple[str, ...],
    state: StateStore,
    bus: Bus,
    plans: asyncio.Queue[PlanCreated],
) -> Live:
    return Live(start_planner, nodes, state, bus, plans)
