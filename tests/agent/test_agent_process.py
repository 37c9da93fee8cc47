"""The agent as it runs in production: ``python -m unicron.services.agent`` against real NATS and
Redis.

Everything is awaited on the bus or in Redis with a deadline; nothing sleeps and hopes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from unicron.services.agent.agent import Agent
from unicron.services.agent.registry import EntrypointRegistry
from unicron.services.agent.settings import AgentSettings
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import NodeJoined
from unicron.shared.contracts.messages import DeadLetter, StopWorkers, command_subject
from unicron.shared.contracts.models import NodeRecord, NodeState
from unicron.shared.contracts.reports import (
    REPORT,
    StepCompleted,
    WorkerExited,
    WorkerStarted,
)
from unicron.shared.contracts.workerchannel import WorkerLaunch
from unicron.shared.procs import port_open
from unicron.shared.servers.embedded import EmbeddedServer, start_nats, start_redis
from unicron.shared.store.state import StateStore

from tests.agent.conftest import record_job, send_start, start_cmd, until
from tests.agent.process import NODE, Heard, inbox, node_record


def gone(pid: int) -> bool:
    """No such process, or only a zombie left for its parent to reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


@pytest.fixture
async def stale_record(state: StateStore) -> NodeRecord:
    """What an earlier boot of the node left in Redis."""
    old = NodeRecord(
        id=NODE, state=NodeState.QUARANTINED, slots=9, used=7, boot_id="old", store_port=1
    )
    await state.put_node(old)
    return old


async def test_agent_serves_its_node(
    stale_record: NodeRecord,
    bus: Bus,
    state: StateStore,
    agent: subprocess.Popen[bytes],
    joined: NodeJoined,
    heard: Heard,
    tmp_path: Path,
) -> None:
    reports, letters = heard

    # registered from scratch (nothing kept from the earlier boot), with its store, heartbeating
    node = await node_record(state, lambda n: n.boot_id == joined.boot_id)
    assert (node.slots, node.state, node.used, node.host) == (4, NodeState.READY, 0, "127.0.0.1")
    assert node.store_port != stale_record.store_port
    assert port_open("127.0.0.1", node.store_port)
    await node_record(state, lambda n: n.last_heartbeat > node.last_heartbeat)

    # a start launches the registered entrypoint with the launch JSON; its reports arrive
    hang, _ = start = start_cmd("job-a", "hang", steps=2)
    await send_start(bus, state, start)
    first = await reports.report(WorkerStarted, job_id="job-a")
    assert [(await reports.report(StepCompleted, job_id="job-a")).step for _ in range(2)] == [0, 1]
    log_file = tmp_path / "data" / "logs" / "job-a" / "g1-r0.log"
    launch = WorkerLaunch.model_validate_json(log_file.read_text().splitlines()[0])
    assert launch.agent_socket == str(tmp_path / "data" / "agents" / f"{NODE}.sock")
    # the agent derives the checkpoint path under its own data dir: the bus names none
    checkpoints = str((tmp_path / "data" / "checkpoints" / "job-a").absolute())
    assert (launch.checkpoint_dir, launch.rendezvous) == (checkpoints, hang.rendezvous)

    # a duplicate start does nothing; commands run in order, so job-b's exit proves it was seen
    await bus.send_command(NODE, hang.model_copy(update={"command_id": "cmd-duplicate"}))
    await send_start(bus, state, start_cmd("job-b", "exit-3"))
    exit3 = await reports.report(WorkerExited, job_id="job-b")
    assert (exit3.exit_code, exit3.signal, exit3.stopped_by_agent) == (3, None, False)
    assert [r for r in reports.seen if isinstance(r, WorkerStarted) and r.job_id == "job-a"] == [
        first
    ]
    await node_record(state, lambda n: n.used == 1)

    # SIGKILL from outside: reported at once
    killed_at = time.monotonic()
    os.kill(first.pid, signal.SIGKILL)
    killed = await reports.report(WorkerExited, job_id="job-a")
    latency = time.monotonic() - killed_at
    print(f"kill → WorkerExited on the bus: {latency * 1000:.1f} ms")
    assert (killed.signal, killed.exit_code, killed.stopped_by_agent) == (9, None, False)
    assert latency < 1.0

    # a stop kills the job's older generation only, and says the agent did it
    await send_start(bus, state, start_cmd("job-c", "hang", generation=1))
    await reports.report(WorkerStarted, job_id="job-c", generation=1)
    await send_start(bus, state, start_cmd("job-c", "hang", generation=2, rank=1))
    newer = await reports.report(WorkerStarted, job_id="job-c", generation=2)
    await bus.send_command(NODE, StopWorkers(job_id="job-c", below_generation=2))
    stopped = await reports.report(WorkerExited, job_id="job-c")
    assert (stopped.generation, stopped.signal, stopped.stopped_by_agent) == (1, 9, True)

    # garbage and an unknown trainer are dead-lettered; the agent keeps serving
    await bus.js.publish(command_subject(NODE), b"{not json")
    # a command cannot say what to run: the agent reads that from the job record
    evil = start_cmd("job-x", "hang").cmd.model_dump(mode="json")
    evil["spec"] = {"name": "x", "entrypoint": ["rm", "-rf", "/"]}
    await bus.js.publish(command_subject(NODE), json.dumps(evil).encode())
    for _ in range(2):
        letter = await letters.report(DeadLetter, subject=command_subject(NODE))
        assert "invalid message" in letter.reason
    await send_start(bus, state, start_cmd("job-d", "hang"))
    last = await reports.report(WorkerStarted, job_id="job-d")
    assert not gone(newer.pid)

    # SIGTERM: the agent kills and reaps its workers, reports them, and exits cleanly
    agent.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(agent.wait, 20) == 0
    exits = [await reports.report(WorkerExited, stopped_by_agent=True) for _ in range(2)]
    assert {e.pid for e in exits} == {newer.pid, last.pid}
    assert gone(newer.pid) and gone(last.pid)


async def log_says(path: Path, text: str, within: float = 10.0) -> None:
    """Wait until the agent has logged ``text``: the only outside sign of a failed beat."""
    await until(lambda: text in path.read_text(), within)


@pytest.fixture
def restarted() -> Iterator[list[EmbeddedServer]]:
    """Servers a test restarts; requested first, so they stop after the clients closed."""
    servers: list[EmbeddedServer] = []
    yield servers
    for server in servers:
        server.stop()


async def test_agent_rides_out_nats_and_redis_outages(
    restarted: list[EmbeddedServer],
    bus: Bus,
    state: StateStore,
    agent: subprocess.Popen[bytes],
    joined: NodeJoined,
    nats_server: EmbeddedServer,
    redis_server: EmbeddedServer,
    tmp_path: Path,
) -> None:
    reports = await inbox(bus, f"unicron.reports.{NODE}.>", REPORT.validate_json)
    await send_start(bus, state, start_cmd("job-a", "hang"))
    worker = await reports.report(WorkerStarted, job_id="job-a")
    await reports.report(StepCompleted, job_id="job-a")

    # NATS away: heartbeats and supervision go on; the exit report waits for NATS
    nats_server.stop()
    before = await node_record(state, lambda n: n.used == 1)
    await node_record(state, lambda n: n.last_heartbeat > before.last_heartbeat + 0.3)
    os.kill(worker.pid, signal.SIGKILL)
    await node_record(state, lambda n: n.used == 0)
    restarted.append(start_nats(tmp_path / "nats", port=nats_server.port))
    exited = await reports.report(WorkerExited, within=30, job_id="job-a")
    assert (exited.pid, exited.signal) == (worker.pid, 9)

    # Redis away: the agent logs the outage once and retries; back, it heartbeats again
    redis_server.stop()
    await log_says(tmp_path / "agent.log", "heartbeat: server unavailable")
    restarted.append(start_redis(tmp_path / "redis", port=redis_server.port))
    await node_record(state, lambda n: n.boot_id == joined.boot_id)
    assert agent.poll() is None

    await send_start(bus, state, start_cmd("job-b", "hang"))  # and it still takes commands
    await reports.report(WorkerStarted, job_id="job-b", within=30)


async def test_command_for_an_unregistered_trainer_is_dead_lettered(
    bus: Bus, state: StateStore, tmp_path: Path
) -> None:
    """In process (no torch needed): a node with no entrypoint for the trainer refuses it once,
    to the dead letters, instead of failing the handler into five redeliveries."""
    letters = await inbox(bus, "unicron.deadletter", DeadLetter.model_validate_json)
    node = Agent(AgentSettings(node_id=NODE, data_dir=tmp_path), bus, state)
    node.supervisor.registry = EntrypointRegistry()
    node.outbox.start()
    try:
        start = start_cmd("job-a", "hang")
        await record_job(state, start)
        await node.handle(start.cmd)
        letter = await letters.report(DeadLetter, subject=command_subject(NODE))
        assert "not registered" in letter.reason
        assert node.supervisor.live() == []
    finally:
        await node.outbox.close()
