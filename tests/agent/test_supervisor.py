"""The supervisor launches registered workers once, and reports every exit as it happens."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from unicron.services.agent.outbox import Report
from unicron.services.agent.supervisor import CommandRejectedError, Supervisor, WorkerKey
from unicron.shared.contracts.messages import StopWorkers
from unicron.shared.contracts.reports import StepCompleted, WorkerExited, WorkerStarted
from unicron.shared.contracts.workerchannel import WorkerLaunch

from tests.agent.conftest import RecordingSink, start_cmd


def block_until_gone(pid: int, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def drain(sink: RecordingSink) -> list[Report]:
    items = []
    while not sink.reports.empty():
        items.append(sink.reports.get_nowait())
    return items


async def started(sink: RecordingSink) -> WorkerStarted:
    return await sink.next(WorkerStarted)


async def exited(sink: RecordingSink) -> WorkerExited:
    return await sink.next(WorkerExited)


async def test_launch_passes_the_launch_json_and_logs_to_a_file(
    supervisor: Supervisor, sink: RecordingSink, tmp_path: Path
) -> None:
    cmd, ctx = start_cmd("job-a", "exit-0", generation=2, rank=1)
    await supervisor.start_worker(cmd, ctx)
    report = await started(sink)
    assert (report.job_id, report.generation, report.rank) == ("job-a", 2, 1)
    assert (await exited(sink)).exit_code == 0
    log_file = tmp_path / "logs" / "job-a" / "g2-r1.log"
    launch = WorkerLaunch.model_validate_json(log_file.read_text().splitlines()[0])
    assert launch.agent_socket == str(supervisor.socket_path)
    assert launch.checkpoint_dir == str(ctx.checkpoint_dir)
    assert (launch.node_id, launch.world_size, launch.spec) == ("n1", 2, ctx.spec)
    assert launch.rendezvous == cmd.rendezvous


async def test_duplicate_start_launches_nothing(
    supervisor: Supervisor, sink: RecordingSink
) -> None:
    cmd, ctx = start_cmd("job-a", "exit-0")
    await supervisor.start_worker(cmd, ctx)
    await supervisor.start_worker(cmd.model_copy(update={"command_id": "cmd-again"}), ctx)
    kinds = []
    while "worker_exited" not in kinds:
        kinds.append((await asyncio.wait_for(sink.reports.get(), 10)).kind)
    await supervisor.start_worker(cmd, ctx)  # after the worker finished, too
    assert kinds.count("worker_started") == 1
    assert drain(sink) == []
    assert len(supervisor.live()) == 0


async def test_a_worker_s_last_reports_arrive_before_its_exit(
    supervisor: Supervisor, sink: RecordingSink, tmp_path: Path
) -> None:
    """A worker reports its steps on a new connection and exits while the agent is busy: its
    exit and its unread lines wait together, and a job whose exit overtook its last steps would
    look short."""
    go = tmp_path / "go"
    await supervisor.start_worker(
        *start_cmd("job-a", "burst", steps=200, env={"BURST_GO": str(go)})
    )
    pid = (await started(sink)).pid
    go.touch()
    block_until_gone(pid)  # the agent's loop is held: it sees the exit and the lines at once
    kinds: list[str] = []
    while "worker_exited" not in kinds:
        kinds.append((await asyncio.wait_for(sink.reports.get(), 10)).kind)
    assert kinds.count("step_completed") == 200
    assert drain(sink) == []


async def test_sigkill_is_reported_at_once(supervisor: Supervisor, sink: RecordingSink) -> None:
    await supervisor.start_worker(*start_cmd("job-a", "hang"))
    pid = (await started(sink)).pid
    await sink.next(StepCompleted)  # the worker is up and talking
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    report = await exited(sink)
    latency = time.monotonic() - killed_at
    print(f"in-process kill→WorkerExited: {latency * 1000:.1f} ms")
    assert (report.pid, report.signal, report.exit_code) == (pid, 9, None)
    assert not report.stopped_by_agent
    assert latency < 1.0


async def test_exit_code_is_reported(supervisor: Supervisor, sink: RecordingSink) -> None:
    await supervisor.start_worker(*start_cmd("job-a", "exit-3"))
    report = await exited(sink)
    assert (report.exit_code, report.signal, report.stopped_by_agent) == (3, None, False)


async def test_stop_kills_only_older_generations(
    supervisor: Supervisor, sink: RecordingSink
) -> None:
    await supervisor.start_worker(*start_cmd("job-a", "hang", generation=1))
    await supervisor.start_worker(*start_cmd("job-a", "hang", generation=2, rank=1))
    await supervisor.start_worker(*start_cmd("job-b", "hang", generation=1))
    await supervisor.stop_workers(StopWorkers(job_id="job-a", below_generation=2))
    report = await exited(sink)
    assert (report.job_id, report.generation, report.signal) == ("job-a", 1, 9)
    assert report.stopped_by_agent
    assert {w.key for w in supervisor.live()} == {
        WorkerKey("job-a", 2, 1),
        WorkerKey("job-b", 1, 0),
    }
    await supervisor.stop_workers(StopWorkers(job_id="job-a", below_generation=2))  # idempotent
    # a late start for the stopped generation is stale and ignored
    await supervisor.start_worker(*start_cmd("job-a", "hang", generation=1, rank=5))
    await supervisor.stop_workers(StopWorkers(job_id="job-a"))
    assert (await exited(sink)).generation == 2
    assert [w.key.job_id for w in supervisor.live()] == ["job-b"]


async def test_shutdown_leaves_no_worker(supervisor: Supervisor, sink: RecordingSink) -> None:
    for rank in range(2):
        await supervisor.start_worker(*start_cmd("job-a", "hang", rank=rank))
    pids = {(await started(sink)).pid for _ in range(2)}
    await supervisor.shutdown()
    reports = [r for r in drain(sink) if isinstance(r, WorkerExited)]
    assert {r.pid for r in reports} == pids
    assert all(r.stopped_by_agent for r in reports)
    assert supervisor.live() == []
    with pytest.raises(RuntimeError):
        await supervisor.start_worker(*start_cmd("job-a", "hang", rank=3))


async def test_unregistered_trainer_and_unsafe_job_id_are_rejected(
    supervisor: Supervisor,
) -> None:
    supervisor.registry = type(supervisor.registry)()  # nothing registered
    with pytest.raises(CommandRejectedError, match="not registered"):
        await supervisor.start_worker(*start_cmd("job-a", "hang"))
    with pytest.raises(CommandRejectedError, match="safe"):
        await supervisor.start_worker(*start_cmd("../../etc", "hang"))
    assert supervisor.live() == []
