"""A start that finds the node's only spare still warming up takes that spare once it is up,
rather than start a fresh interpreter that would repeat its whole import; a warming spare that
dies, or is later than a fresh process would be, leaves the start to spawn one.

The spare is the stdlib fake worker held at a FIFO gate (``$SPARE_GATE``) until the test opens
it: a spare warming up for exactly as long as the test wants. Everything is awaited with a
deadline.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from unicron.services.agent.channel import WorkerChannel
from unicron.services.agent.registry import EntrypointRegistry
from unicron.services.agent.spares import Spare, SparePool
from unicron.services.agent.supervisor import Supervisor, WorkerKey
from unicron.shared.contracts.messages import StopWorkers
from unicron.shared.contracts.reports import StepCompleted, WorkerStarted

from tests.agent.conftest import RecordingSink, spare_pool, start_cmd, until
from tests.agent.process import FAKE_WORKER
from tests.agent.test_faults import cuda_visible


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The FIFO every spare started from now on waits at before it connects."""
    path = tmp_path / "spare-gate"
    os.mkfifo(path)
    monkeypatch.setenv("SPARE_GATE", str(path))
    return path


def opened(gate: Path) -> bool:
    """Open the gate for the spares waiting at it, if one is; False while none is."""
    try:
        fd = os.open(gate, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader yet: the spare has not reached the gate
            return False
        raise
    os.close(fd)  # a reader that opened it sees the end of the file and goes on
    return True


@pytest.fixture
async def spares(
    supervisor: Supervisor, channel: WorkerChannel, tmp_path: Path, gate: Path
) -> AsyncIterator[SparePool]:
    argv = EntrypointRegistry({"gpt": FAKE_WORKER}).argv("gpt")
    async with spare_pool(argv, supervisor, channel, tmp_path) as pool:
        yield pool


async def warming_spare(spares: SparePool) -> Spare:
    await until(lambda: len(spares.waiting()) == 1)
    assert spares.ready() == []
    return spares.waiting()[0]


async def test_a_start_takes_the_spare_that_is_still_warming_up(
    supervisor: Supervisor, spares: SparePool, sink: RecordingSink, gate: Path
) -> None:
    supervisor.slots.use(["7"])  # a node with one GPU: the spare gets it only with its launch
    warming = await warming_spare(spares)
    start = start_cmd("job-w", "hang", steps=2)
    await supervisor.start_worker(*start)  # returns at once: the node's next command may come
    assert warming.taken and supervisor.live() == []
    await supervisor.start_worker(*start)  # a redelivered start is a duplicate while it waits
    await until(lambda: opened(gate))

    started = await started_and_stepping(sink)
    assert started.pid == warming.proc.pid, "a fresh interpreter was started"
    assert started.warm and started.spare_wait_s > 0
    assert [w.proc.pid for w in supervisor.live()] == [warming.proc.pid]
    log = supervisor.log_path(WorkerKey("job-w", 1, 0))
    await until(lambda: cuda_visible(log) == "7")


async def test_a_warming_spare_that_dies_leaves_the_start_to_spawn(
    supervisor: Supervisor, spares: SparePool, sink: RecordingSink
) -> None:
    warming = await warming_spare(spares)
    await supervisor.start_worker(*start_cmd("job-d", "hang", steps=2))
    assert warming.taken
    os.kill(warming.proc.pid, signal.SIGKILL)

    started = await started_and_stepping(sink)
    assert started.pid != warming.proc.pid
    assert not started.warm and started.spare_wait_s > 0  # what the recovery waited on


async def test_a_spare_later_than_a_fresh_process_is_given_up(
    supervisor: Supervisor, spares: SparePool, sink: RecordingSink
) -> None:
    spares.warmups.append(0.2)  # a fresh interpreter is up in 0.2 s on this node now
    warming = await warming_spare(spares)
    await supervisor.start_worker(*start_cmd("job-l", "hang", steps=2))

    started = await sink.next(WorkerStarted)
    assert started.pid != warming.proc.pid
    assert not started.warm and started.spare_wait_s > 0.15
    await ended(warming)  # the spare its start gave up on is killed, not left to idle
    assert warming.proc.returncode == -signal.SIGKILL


async def test_a_stop_of_its_generation_cancels_a_start_waiting_for_a_spare(
    supervisor: Supervisor, spares: SparePool, sink: RecordingSink
) -> None:
    supervisor.slots.use(["7"])
    warming = await warming_spare(spares)
    await supervisor.start_worker(*start_cmd("job-c", "hang", steps=2))
    assert supervisor.slots.free() == 0  # the waiting start holds the device it will launch on

    await supervisor.stop_workers(StopWorkers(job_id="job-c", below_generation=2))
    await ended(warming)
    assert supervisor.slots.free() == 1 and supervisor.live() == []
    assert not any(isinstance(r, WorkerStarted) for r in drain(sink))


async def started_and_stepping(sink: RecordingSink) -> WorkerStarted:
    """The worker's start report; a spare may step before the agent reports it started."""
    got = await sink.gather(WorkerStarted, StepCompleted)
    return next(r for r in got if isinstance(r, WorkerStarted))


async def ended(spare: Spare) -> None:
    assert spare.waiter is not None
    async with asyncio.timeout(10):
        await spare.waiter


def drain(sink: RecordingSink) -> list[object]:
    reports = []
    while not sink.reports.empty():
        reports.append(sink.reports.get_nowait())
    return reports


async def test_a_claimed_warming_spare_is_replaced_at_once_not_after_the_delay(
    supervisor: Supervisor, channel: WorkerChannel, tmp_path: Path, gate: Path
) -> None:
    """The delay after a served start leaves the CPU to the transition; a start that claims a
    spare still warming leaves the node none ready for the next fault, so the next one starts
    now (a crash right after a job's start found no spare up: recovery 2.0 s instead of 0.3 s
    in ``make test-multihost``)."""
    argv = EntrypointRegistry({"gpt": FAKE_WORKER}).argv("gpt")
    async with spare_pool(argv, supervisor, channel, tmp_path, delay_s=600.0) as pool:
        warming = await warming_spare(pool)
        claim = pool.claim()
        assert claim is not None and warming.taken
        await until(lambda: [s for s in pool.waiting() if s is not warming] != [])
        pool.drop(claim)
