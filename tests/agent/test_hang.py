"""Hang detection: the threshold rules on a fake clock, then real fake workers that stop
stepping (reported once, on time) or step with jitter beside a busy core (never reported)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Literal

import pytest
from unicron.services.agent import hang
from unicron.services.agent.hang import HangWatch
from unicron.services.agent.procstat import process_state
from unicron.services.agent.settings import AgentSettings
from unicron.services.agent.supervisor import Supervisor, Worker, WorkerKey
from unicron.shared.contracts.reports import StepCompleted, WorkerException, WorkerHung, WorkerPhase

from tests.agent.conftest import RecordingSink, start_cmd

KEY = WorkerKey("job-a", 1, 0)
# healthy steps per worker in the false-alarm test; raise it for a soak (two workers run)
HEALTHY_STEPS = int(os.environ.get("AGENT_TEST_HEALTHY_STEPS", "300"))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def fake_worker(key: WorkerKey = KEY, started_at: float = 1000.0) -> Worker:
    proc = SimpleNamespace(pid=os.getpid(), returncode=None)
    return Worker(key, proc, key.generation, started_at=started_at)  # type: ignore[arg-type]


def steps(watch: HangWatch, clock: Clock, count: int, iteration_s: float) -> None:
    """``count`` steps of ``iteration_s`` each, numbered on from the last one."""
    for _ in range(count):
        clock.t += iteration_s
        track = watch._tracks.get(KEY)
        step = 0 if track is None or track.last_step is None else track.last_step + 1
        report = StepCompleted(
            node_id="n1", job_id="job-a", generation=1, rank=0, step=step, loss=1.0,
            iteration_s=iteration_s,
        )  # fmt: skip
        watch.observe(KEY, report)


def phase(
    watch: HangWatch, name: Literal["compute", "collective", "checkpoint"], gen: int = 1
) -> None:
    report = WorkerPhase(node_id="n1", job_id="job-a", generation=gen, rank=0, phase=name, step=1)
    watch.observe(KEY, report)


def silent_until_hung(watch: HangWatch, clock: Clock, tick: float = 0.05) -> WorkerHung:
    """Advance the clock a check interval at a time until the watch reports a hang."""
    for _ in range(100_000):
        clock.t += tick
        if hung := watch.check():
            return hung[0]
    raise AssertionError("never reported")


@pytest.fixture
def setup() -> tuple[HangWatch, Clock, list[Worker]]:
    clock, workers = Clock(), [fake_worker()]
    watch = HangWatch(AgentSettings(node_id="n1"), lambda: workers, RecordingSink(), clock)
    return watch, clock, workers


def test_thresholds_follow_the_running_median(setup: tuple[HangWatch, Clock, list[Worker]]) -> None:
    watch, clock, _ = setup
    assert silent_until_hung(watch, clock).threshold_s == 60.0  # before the first step
    steps(watch, clock, 3, 0.04)
    assert watch.threshold(watch._tracks[KEY]) == 10.0  # warming up
    steps(watch, clock, 20, 0.04)
    assert watch.threshold(watch._tracks[KEY]) == pytest.approx(0.54)
    steps(watch, clock, 2, 0.15)  # a GC pause, a slow step: the median does not move
    assert watch.threshold(watch._tracks[KEY]) == pytest.approx(0.54)
    steps(watch, clock, 20, 1.0)  # slow steps for good: 3 x mean wins over mean + margin
    assert watch.threshold(watch._tracks[KEY]) == pytest.approx(3.0)


def test_a_stall_the_worker_just_survived_is_no_hang(
    setup: tuple[HangWatch, Clock, list[Worker]],
) -> None:
    # A busy node descheduled the worker for 0.5 s: a healthy step, slower than mean + margin.
    watch, clock, _ = setup
    steps(watch, clock, 10, 0.04)
    steps(watch, clock, 1, 0.5)
    steps(watch, clock, 3, 0.04)
    assert watch.threshold(watch._tracks[KEY]) == pytest.approx(0.75)  # 1.5 x the stall
    steps(watch, clock, 20, 0.04)  # out of the window: back to mean + margin
    assert watch.threshold(watch._tracks[KEY]) == pytest.approx(0.54)


def test_a_hang_is_reported_once_per_step(setup: tuple[HangWatch, Clock, list[Worker]]) -> None:
    watch, clock, _ = setup
    steps(watch, clock, 10, 0.04)
    phase(watch, "compute")
    clock.t += 0.54
    assert watch.check() == []
    hung = silent_until_hung(watch, clock)
    assert (hung.last_step, hung.phase, hung.mean_iteration_s) == (9, "compute", 0.04)
    assert hung.process_state in "RS" and hung.pid == os.getpid()
    # confirmed at the second check over the threshold, so at most two intervals late
    assert hung.threshold_s < hung.silent_s <= hung.threshold_s + 0.1 + 1e-6
    clock.t += 60
    assert watch.check() == []  # once, however long it stays hung
    steps(watch, clock, 1, 0.04)  # it moves on, then hangs again: a new report
    assert silent_until_hung(watch, clock).last_step == 10


def test_checkpoint_and_reformation_are_not_hangs(
    setup: tuple[HangWatch, Clock, list[Worker]],
) -> None:
    watch, clock, workers = setup
    steps(watch, clock, 10, 0.04)
    phase(watch, "checkpoint")
    clock.t += 30  # a long write on rank 0
    assert watch.check() == [] and watch.check() == []
    phase(watch, "compute")  # the checkpoint's time does not count against the next step
    clock.t += 0.3
    assert watch.check() == [] and watch.check() == []
    phase(watch, "collective", gen=2)  # re-formed in place under generation 2
    clock.t += 0.5
    assert watch.check() == [] and watch.check() == []
    hung = silent_until_hung(watch, clock)
    # the warm-up floor again: a re-formed group's first steps wait for its joiners
    assert (hung.generation, hung.phase, hung.threshold_s) == (2, "collective", 10.0)
    workers.clear()  # it exited: forgotten
    assert watch.check() == [] and watch._tracks == {}


def test_a_parked_rank_waits_for_its_regroup_not_for_a_step(
    setup: tuple[HangWatch, Clock, list[Worker]],
) -> None:
    watch, clock, _ = setup
    steps(watch, clock, 10, 0.04)
    peer_gone = WorkerException(
        node_id="n1", job_id="job-a", generation=1, rank=0, pid=os.getpid(),
        exc_type="RuntimeError", message="Connection reset by peer",
        category="connection_reset", parked=True,
    )  # fmt: skip
    watch.observe(KEY, peer_gone)
    clock.t += 30  # parked, within its park timeout
    assert watch.check() == [] and watch.check() == []
    phase(watch, "collective", gen=2)  # re-formed: watched again
    assert silent_until_hung(watch, clock).generation == 2


def test_a_worker_past_the_last_step_is_finishing_not_hung(
    setup: tuple[HangWatch, Clock, list[Worker]],
) -> None:
    watch, clock, workers = setup
    workers[0].last_step = 10
    steps(watch, clock, 10, 0.04)  # steps 0..9: one to go, so silence now is a hang
    assert silent_until_hung(watch, clock).last_step == 9
    steps(watch, clock, 1, 0.04)  # the last step: its checkpoint and exit take what they take
    clock.t += 60
    assert watch.check() == [] and watch.check() == []


def test_process_state_reads_proc() -> None:
    assert process_state(os.getpid()) == "R"  # reading its own stat, so running
    assert process_state(2**22 + 1) == "?"


# --- real workers -------------------------------------------------------------------------


async def test_worker_that_stops_stepping_is_reported_once(
    supervisor: Supervisor, sink: RecordingSink, watch: HangWatch
) -> None:
    await supervisor.start_worker(*start_cmd("job-a", "step-20-60-150-0", steps=25))
    for _ in range(25):
        await sink.next(StepCompleted)
    last_at = time.monotonic()
    hung = await sink.next(WorkerHung, within=5)
    latency = time.monotonic() - last_at
    print(
        f"hang detection: {latency * 1000:.0f} ms after the last step; "
        f"threshold {hung.threshold_s * 1000:.0f} ms, silent_s {hung.silent_s * 1000:.0f} ms"
    )
    assert (hung.job_id, hung.last_step, hung.phase) == ("job-a", 24, "compute")
    assert hung.process_state == "S"  # asleep in its "compute": alive, not stopped
    assert 0.5 < hung.threshold_s < 0.7  # mean + margin: 3 x mean is less for short steps
    assert hung.threshold_s - 0.1 < latency <= hung.threshold_s + 0.5
    await asyncio.sleep(0.5)  # proving an absence takes time: ten more checks
    assert not any(isinstance(r, WorkerHung) for r in drain(sink))


def drain(sink: RecordingSink) -> list[object]:
    items: list[object] = []
    while not sink.reports.empty():
        items.append(sink.reports.get_nowait())
    return items


@pytest.fixture
def busy_core() -> Iterator[None]:
    """Another process spinning on a core, as a co-located job or a noisy neighbour would."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    proc.kill()
    proc.wait()


@pytest.mark.extended  # a false-alarm run: bench/detect.py counts them too
async def test_healthy_jittery_workers_are_never_hung(
    supervisor: Supervisor, sink: RecordingSink, watch: HangWatch, busy_core: None
) -> None:
    """20-60 ms steps with a 150 ms one now and then, rank 0 checkpointing for 0.6 s every 100
    steps (past the 0.5 s threshold) and the other core busy: not one false alarm."""
    for job, rank in (("job-a", 0), ("job-b", 1)):
        # they step on past HEALTHY_STEPS: one that ran out of steps would rightly be hung
        behaviour, count = "step-20-60-150-600", 10 * HEALTHY_STEPS
        start = start_cmd(job, behaviour, rank=rank, steps=count, checkpoint_every=100)
        await supervisor.start_worker(*start)
    done: set[str] = set()
    hung: list[WorkerHung] = []
    counted = 0
    async with asyncio.timeout(HEALTHY_STEPS * 0.2 + 30):
        while len(done) < 2:
            report = await sink.reports.get()
            if isinstance(report, WorkerHung):
                hung.append(report)
            elif isinstance(report, StepCompleted):
                counted += 1
                if report.step == HEALTHY_STEPS - 1:
                    done.add(report.job_id)
    print(f"false alarms: {len(hung)} over {counted} healthy steps")
    assert hung == []


def test_time_waiting_for_a_cpu_is_not_silence(
    setup: tuple[HangWatch, Clock, list[Worker]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a busy node a healthy worker waits on the run queue, runnable but without a CPU.
    watch, clock, _ = setup
    queued = [100.0]
    monkeypatch.setattr(hang, "runqueue_wait_s", lambda _pid: queued[0])
    steps(watch, clock, 10, 0.04)
    assert watch.check() == []  # the first look after a step notes the run-queue time
    clock.t += 0.8
    queued[0] += 0.5  # 0.8 s without a step, 0.5 s of it waiting for a CPU
    assert watch.check() == [] and watch.check() == []
    clock.t += 0.3  # then silent while it could run: 0.6 s against 0.54 s
    assert silent_until_hung(watch, clock).silent_s == pytest.approx(0.65, abs=0.06)
