"""Calibration against real Redis: what reports and events change, and that it survives restarts."""

from __future__ import annotations

import pytest
from unicron.planning.api import JobDemand, TransitionKind
from unicron.planning.clusters import CPU
from unicron.planning.throughput import MegatronThroughput
from unicron.services.planner.calibration import CalibrationStore, FailurePrior
from unicron.services.planner.feedback import Feedback
from unicron.shared.contracts.events import FailureDetected, TransitionCompleted
from unicron.shared.contracts.models import Job, JobSpec, JobState, PlanAction, now
from unicron.shared.contracts.plans import JobAllocation, JobExplanation, Plan
from unicron.shared.contracts.reports import StepCompleted
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind, RecoveryAction, Severity
from unicron.shared.store.state import StateStore

PRIOR = FailurePrior(rate_per_gpu_h=1e-3, gpu_h=10.0, half_life_h=24.0)
MODEL = MegatronThroughput(CPU)


def store(state: StateStore) -> CalibrationStore:
    return CalibrationStore(state.calibration, PRIOR, alpha=0.5)


async def running_job(state: StateStore, generation: int = 2, world: int = 2) -> Job:
    job = Job(
        id="job-1", name="job-1", spec=JobSpec(name="job-1", global_batch=8, micro_batch=2),
        state=JobState.RUNNING, generation=generation, world_size=world, plan_id="plan-1",
    )  # fmt: skip
    await state.create_job(job)
    return job


def step(
    job: Job, n: int, seconds: float, rank: int = 0, resumed: int | None = None
) -> StepCompleted:
    return StepCompleted(
        node_id="node-a", job_id=job.id, generation=job.generation, rank=rank, step=n,
        loss=1.0, iteration_s=seconds, resumed_from=resumed,
    )  # fmt: skip


async def test_step_reports_calibrate_the_job_and_survive_a_restart(state: StateStore) -> None:
    job = await running_job(state)
    modelled = MODEL.modelled_iteration_s(JobDemand.of(job.id, job.spec), 2)
    feedback = Feedback(state, store(state), MODEL)
    await feedback.on_report(step(job, 11, 100.0, resumed=10))  # warm-up after a restore
    await feedback.on_report(step(job.model_copy(update={"generation": 3}), 1, 100.0))  # first
    for n in range(12, 16):
        await feedback.on_report(step(job, n, 3 * modelled))
        await feedback.on_report(step(job, n, 50 * modelled, rank=1))  # only rank 0 counts
    await feedback.flush()
    calibration = await store(state).load()  # a fresh store: what a new planner reads
    assert calibration.job_slowdown == (("job-1", 3.0),)
    await feedback.flush()  # nothing new: nothing changes
    assert (await store(state).load()).job_slowdown == (("job-1", 3.0),)
    await store(state).forget_job("job-1")
    assert (await store(state).load()).job_slowdown == ()


async def test_measured_transitions_calibrate_their_kind(state: StateStore) -> None:
    job = await running_job(state)
    why = JobExplanation(transition="restart", predicted_downtime_s=4.0, downtime_factor=2.0)
    allocation = JobAllocation(job_id=job.id, workers=2, action=PlanAction.RESTART, explanation=why)
    await state.save_plan(Plan(id="plan-1", allocations=[allocation]))
    completed = TransitionCompleted(
        job_id=job.id, action=PlanAction.RESTART, generation=2, world_size=2, resumed_step=10,
        downtime_s=9.0, duration_s=6.0,
    )  # fmt: skip
    feedback = Feedback(state, store(state), MODEL)
    await feedback.on_transition("ev-1", completed)
    await feedback.on_transition("ev-1", completed)  # redelivered: counted once
    factors = dict((await store(state).load()).transition_factors)
    # 6 s from the transition's start to its first step / 2 s modelled; the 3 s of detection
    # and planning before it are no part of what the cost model prices.
    assert factors == {TransitionKind.RESTART: 3.0}
    stale = completed.model_copy(update={"generation": 1})
    await feedback.on_transition("ev-2", stale)  # not the generation the job runs now
    assert dict((await store(state).load()).transition_factors) == factors


async def test_failures_raise_the_rate_and_running_time_lowers_it(state: StateStore) -> None:
    calibration = store(state)
    assert (await calibration.load()).failure_rate_per_gpu_h == pytest.approx(1e-3)
    feedback = Feedback(state, calibration, MODEL)
    failure = FailureDetected(
        failure_id="f-1", job_id="job-1", node_id="node-a", rank=0,
        kind=FailureKind.CRASH, category=FailureCategory.EXITED_ABNORMALLY,
        severity=Severity.SEV2, action=RecoveryAction.RESTART, observed_at=now(),
    )  # fmt: skip
    await feedback.on_failure(failure)
    await feedback.on_failure(failure)  # the same failure again: once
    # (1e-3 · 10 + 1 failure) / 10 GPU-hours
    assert (await calibration.load()).failure_rate_per_gpu_h == pytest.approx(0.1)
    await calibration.exposure(1000, at=now())  # starts the clock
    await calibration.exposure(1000, at=now() + 36.0)  # 1000 GPUs for 36 s = 10 GPU-hours
    assert (await calibration.load()).failure_rate_per_gpu_h == pytest.approx(0.05, rel=0.02)
