"""Planner processes and the cluster they plan, on each test's own NATS and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.contracts.events import CloudEvent, PlanCreated
from unicron.shared.contracts.models import NodeRecord, now
from unicron.shared.procs import die_with_parent
from unicron.shared.store.state import StateStore

from tests.planner.live import Live, StartPlanner

REPO = Path(__file__).resolve().parents[2]
NODES = ("node-a", "node-b")


@pytest.fixture
def start_planner(nats_url: str, redis_url: str, tmp_path: Path) -> Iterator[StartPlanner]:
    """Start ``python -m unicron.services.planner``; every one started is stopped at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(**settings: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "UNICRON_NATS_URL": nats_url,
            "UNICRON_REDIS_URL": redis_url,
            **{f"UNICRON_{k.upper()}": v for k, v in settings.items()},
        }
        with (tmp_path / f"planner-{len(procs)}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "unicron.services.planner"],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    for log in sorted(tmp_path.glob("planner-*.log")):
        print(f"--- {log.name}\n{log.read_text()[-4000:]}")  # shown when a test fails


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
