"""A node cut off from Redis and NATS for longer than ``node_timeout_s`` stops its own workers
(issue 13): by then the control plane counts it lost and re-places its ranks, so they must not
train on under the old generation. A shorter blip spares them, and so does a Redis that is away
while NATS answers (Redis down for everyone; the control plane judges no node meanwhile).
Everything is awaited with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from unicron.services.agent.agent import Agent
from unicron.services.agent.fence import Fence
from unicron.services.agent.settings import AgentSettings
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.models import NodeState, now
from unicron.shared.contracts.reports import REPORT, WorkerExited
from unicron.shared.servers.embedded import EmbeddedServer
from unicron.shared.store.state import StateStore

from tests.agent.conftest import record_job, start_cmd, until
from tests.agent.process import FAKE_WORKER, NODE, inbox, node_record

INTERVAL_S, MISSES = 0.25, 12  # node_timeout_s: 3 s, well above a restart of both servers
FENCE_BOUND_S = 1.5  # from the deadline to every worker reaped


@pytest.fixture
async def node(bus: Bus, state: StateStore, tmp_path: Path) -> AsyncIterator[Agent]:
    """The agent, in this process, registered and running two workers of one job."""
    settings = AgentSettings(
        node_id=NODE, data_dir=tmp_path, spares=0, entrypoints={"gpt": FAKE_WORKER},
        heartbeat_interval_s=INTERVAL_S, heartbeat_misses=MISSES,
    )  # fmt: skip
    agent = Agent(settings, bus, state)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        # generous: the agent imports torch for its store, slow on a loaded machine
        await until(lambda: agent.registration.registered or task.done(), within=60)
        first = start_cmd("job-f", "hang")
        await record_job(state, first)
        await agent.handle(first.cmd)
        await agent.handle(start_cmd("job-f", "hang", rank=1).cmd)
        await until(lambda: len(agent.supervisor.live()) == 2)
        yield agent
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=30)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def still_running(node: Agent, since: float, state: StateStore) -> None:
    """A heartbeat lands again, and the workers live past the moment a fence would have
    fired: nothing marks "not stopped", so this waits that moment out."""
    back_at = now()
    await node_record(state, lambda n: n.last_heartbeat > back_at)
    await asyncio.sleep(max(0.0, since + node.settings.node_timeout_s + 0.5 - time.monotonic()))
    assert node.fence.fences == 0 and len(node.supervisor.live()) == 2


async def test_a_node_cut_off_for_node_timeout_stops_its_workers(
    node: Agent,
    bus: Bus,
    state: StateStore,
    redis_server: EmbeddedServer,
    nats_server: EmbeddedServer,
) -> None:
    reports = await inbox(bus, f"unicron.reports.{NODE}.>", REPORT.validate_json)
    timeout = node.settings.node_timeout_s
    pids = [w.proc.pid for w in node.supervisor.live()]

    # cut off from both for less than node_timeout_s: the workers live on
    blip_began = time.monotonic()
    redis_server.restart()
    nats_server.restart()
    assert time.monotonic() - blip_began < timeout - INTERVAL_S, "servers restarted too slowly"
    await still_running(node, blip_began, state)

    # Redis away for longer, NATS still answering: not cut off, the workers live on
    redis_server.stop()
    redis_gone = time.monotonic()
    await until(lambda: node.fence.spared, within=timeout + 1)  # it asked NATS: answered
    await asyncio.sleep(max(0.0, redis_gone + timeout + 0.5 - time.monotonic()))  # outlast it
    redis_server.restart()
    await still_running(node, redis_gone, state)

    # cut off from both for longer: every worker is killed, no later than node_timeout_s past
    # the last beat that landed, and its exit says its agent stopped it (no fault to blame)
    redis_server.stop()
    cut_at = time.monotonic()
    nats_server.stop()
    await until(lambda: not node.supervisor.live(), within=timeout + FENCE_BOUND_S)
    stopped_after = time.monotonic() - cut_at
    assert stopped_after > timeout - INTERVAL_S - 0.3, "fenced before node_timeout_s"
    assert all(gone(pid) for pid in pids) and node.fence.fences == 1

    # back: the heartbeat registers the node again, READY and with no workers, and the exits
    # go out on NATS
    nats_server.restart()
    redis_server.restart()
    back_at = now()
    record = await node_record(state, lambda n: n.last_heartbeat > back_at)
    assert (record.state, record.workers, record.used) == (NodeState.READY, [], 0)
    assert record.boot_id == node.boot_id and not node.fence.fenced
    for pid in pids:
        exited = await reports.report(WorkerExited, within=30, pid=pid)
        assert exited.stopped_by_agent and exited.signal == 9


class Node:
    """The fence's view of a node: its workers, and whether NATS answers."""

    def __init__(self, nats_up: bool) -> None:
        self.nats_up = nats_up
        self.workers = 2
        self.stopped_at: float | None = None

    async def stop_workers(self) -> int:
        self.stopped_at, killed, self.workers = time.monotonic(), self.workers, 0
        return killed

    async def nats_answers(self, timeout_s: float) -> bool:
        if not self.nats_up:
            await asyncio.sleep(timeout_s)  # a cut link: the request times out
        return self.nats_up


@contextlib.asynccontextmanager
async def fence_of(node: Node, timeout_s: float) -> AsyncIterator[Fence]:
    fence = Fence(NODE, timeout_s, node.stop_workers, node.nats_answers)
    task = asyncio.create_task(fence.run())
    try:
        yield fence
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_fence_falls_at_node_timeout_when_nats_is_silent_too() -> None:
    node = Node(nats_up=False)
    async with fence_of(node, timeout_s=0.4) as fence:
        began = fence.heard_at
        await until(lambda: fence.fenced, within=2)
        assert node.stopped_at is not None and 0.39 <= node.stopped_at - began < 0.6
        fence.heard(time.monotonic())  # a beat lands: the fence lifts, nothing more to stop
        assert not fence.fenced and fence.fences == 1


async def test_the_fence_stands_while_nats_answers() -> None:
    node = Node(nats_up=True)
    async with fence_of(node, timeout_s=0.4) as fence:
        await until(lambda: fence.spared, within=2)
        await asyncio.sleep(0.5)  # well past the deadline: it keeps asking, and sparing
        assert node.workers == 2 and fence.fences == 0
