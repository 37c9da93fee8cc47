"""Reports about a large job cost a few writes of its record, not one per rank: a burst is
applied together, each state change still announced once, and the steps of a generation that
is already stepping are not even read (issue 22: a 8,192-rank job would otherwise rewrite its
whole record 8,192 times per step and per recovery)."""

from __future__ import annotations

from unicron.services.executor.progress import ProgressTracker
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import JobStateChanged, TransitionCompleted
from unicron.shared.contracts.models import Job, JobState, WorkerRecord, WorkerState, now
from unicron.shared.contracts.reports import AnyReport, StepCompleted, WorkerStarted
from unicron.shared.contracts.transitions import TransitionMode
from unicron.shared.store.records import Mutation
from unicron.shared.store.state import StateStore

from tests.executor.conftest import Events, spec

RANKS = 64


class CountingStore(StateStore):
    """The real store, counting the read-modify-writes of job records."""

    updates = 0

    async def update_job(self, job_id: str, mutate: Mutation[Job]) -> Job | None:
        self.updates += 1
        return await super().update_job(job_id, mutate)


async def starting_job(state: StateStore) -> Job:
    job = Job(
        id="job-big", name="big", spec=spec(), state=JobState.STARTING, generation=1,
        world_size=RANKS, transition_kind=TransitionMode.CHECKPOINT,
        transition_started_at=now(), plan_id="plan-1",
        workers=[WorkerRecord(rank=r, node_id=f"n{r // 8}") for r in range(RANKS)],
    )  # fmt: skip
    await state.create_job(job)
    return job


def step(rank: int, number: int) -> StepCompleted:
    return StepCompleted(node_id=f"n{rank // 8}", job_id="job-big", generation=1, rank=rank,
                         step=number, loss=1.0 / number, iteration_s=0.1)  # fmt: skip


async def test_a_burst_of_reports_starts_a_job_in_a_few_writes_announcing_each_change_once(
    bus: Bus, state: StateStore, events: Events
) -> None:
    store = CountingStore(state.redis)
    await starting_job(store)
    progress = ProgressTracker(bus, store)
    started: list[AnyReport] = [
        WorkerStarted(node_id=f"n{r // 8}", job_id="job-big", generation=1, rank=r, pid=100 + r)
        for r in range(RANKS)
    ]
    await progress.on_reports([*started, *(step(r, 1) for r in range(RANKS))])
    job = await store.get_job("job-big")
    assert job is not None and job.state == JobState.RUNNING and job.step == 1
    assert all(w.state == WorkerState.RUNNING and w.pid == 100 + w.rank for w in job.workers)
    # the starts with the first step (which moves the job), then the rest of the step
    assert store.updates <= 2, store.updates
    moved = await events.next(JobStateChanged, job_id="job-big")
    assert (moved.old, moved.new) == (JobState.STARTING, JobState.RUNNING)
    done = await events.next(TransitionCompleted, job_id="job-big")
    assert done.generation == 1 and done.world_size == RANKS


async def test_steps_of_a_stepping_generation_touch_the_record_only_for_rank_0(
    bus: Bus, state: StateStore
) -> None:
    store = CountingStore(state.redis)
    await starting_job(store)
    progress = ProgressTracker(bus, store)
    await progress.on_reports([step(r, 1) for r in range(RANKS)])
    before = store.updates
    await progress.on_reports([step(r, 2) for r in range(1, RANKS)])
    assert store.updates == before  # nothing read, nothing written
    await progress.on_report(step(0, 2))
    job = await store.get_job("job-big")
    assert job is not None and job.step == 2 and store.updates == before + 1
