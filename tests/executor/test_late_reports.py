"""Reports that come after the one that ended a job: each report travels twice (a fast copy and
the stream's), and a step whose fast copy was lost arrives through the stream after the exits
that ended the job. The job's record keeps the step it reached; nothing revives it."""

from __future__ import annotations

from unicron.services.executor.progress import ProgressTracker
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.models import JobState
from unicron.shared.contracts.reports import StepCompleted, WorkerExited
from unicron.shared.store.state import StateStore

from tests.executor.conftest import running_job


def step(job_id: str, rank: int, number: int) -> StepCompleted:
    return StepCompleted(node_id="n0", job_id=job_id, generation=1, rank=rank, step=number,
                         loss=1.0 / number, iteration_s=0.1)  # fmt: skip


def exit_ok(job_id: str, rank: int) -> WorkerExited:
    return WorkerExited(node_id="n0", job_id=job_id, generation=1, rank=rank, pid=1000 + rank,
                        exit_code=0)  # fmt: skip


async def test_a_last_step_that_comes_after_the_exits_is_the_step_the_job_ended_at(
    bus: Bus, state: StateStore
) -> None:
    job = await running_job(state, ["n0", "n0"])
    progress = ProgressTracker(bus, state)
    await progress.on_reports([step(job.id, r, 29) for r in (0, 1)])
    await progress.on_reports([exit_ok(job.id, 0), exit_ok(job.id, 1)])
    await progress.on_reports([step(job.id, 1, 30), step(job.id, 0, 30), step(job.id, 0, 12)])
    after = await state.get_job(job.id)
    assert after is not None
    assert (after.state, after.step, after.loss) == (JobState.SUCCEEDED, 30, 1.0 / 30)


async def test_a_late_copy_of_an_earlier_step_does_not_take_the_job_back(
    bus: Bus, state: StateStore
) -> None:
    job = await running_job(state, ["n0", "n0"])
    progress = ProgressTracker(bus, state)
    await progress.on_reports([step(job.id, 0, 30)])
    await progress.on_reports([step(job.id, 0, 29), exit_ok(job.id, 0), exit_ok(job.id, 1)])
    after = await state.get_job(job.id)
    assert after is not None and (after.state, after.step) == (JobState.SUCCEEDED, 30)


async def test_a_new_generation_resuming_below_the_step_reached_records_its_own_steps(
    bus: Bus, state: StateStore
) -> None:
    job = await running_job(state, ["n0"], generation=2)  # at step 12, from generation 1
    progress = ProgressTracker(bus, state)
    resumed = StepCompleted(node_id="n0", job_id=job.id, generation=2, rank=0, step=11,
                            loss=0.5, iteration_s=0.1, resumed_from=10)  # fmt: skip
    await progress.on_reports([resumed])
    after = await state.get_job(job.id)
    assert after is not None and (after.step, after.step_generation) == (11, 2)
