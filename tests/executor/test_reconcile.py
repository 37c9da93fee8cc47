"""The executor's reconcile reads job summaries, and the record of a job only when its summary
says there is something to do: workers asked to start that never did are asked for again."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from unicron.services.executor.service import Executor
from unicron.shared.contracts.messages import StartWorker
from unicron.shared.contracts.models import Job, JobState, WorkerRecord, WorkerState
from unicron.shared.store.state import StateStore

from tests.executor.conftest import FakeAgent, running_job, spec


async def test_workers_that_never_started_are_asked_for_again_and_running_jobs_are_not_read(
    executor: Executor,
    state: StateStore,
    agents: dict[str, FakeAgent],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await running_job(state, ["n0", "n1"], job_id="job-running")
    starting = Job(
        id="job-starting", name="s", spec=spec(), state=JobState.STARTING, generation=1,
        world_size=2, plan_id="plan-s", transition_started_at=time.time() - 3600,
        workers=[WorkerRecord(rank=r, node_id=n, state=WorkerState.LAUNCHING)
                 for r, n in enumerate(["n0", "n1"])],
    )  # fmt: skip
    await state.create_job(starting)
    read = record_reads(state, monkeypatch)
    monkeypatch.setattr(state, "list_jobs", None)  # a scan of every record would fail here

    await executor.reconcile()

    def started(commands: list[object]) -> bool:
        return any(isinstance(c, StartWorker) and c.job_id == "job-starting" for c in commands)

    await agents["n0"].wait(started)
    await agents["n1"].wait(started)
    assert read == ["job-starting"]


async def test_ranks_still_launching_are_asked_again_once_each_launch_timeout_under_new_ids(
    executor: Executor,
    state: StateStore,
    agents: dict[str, FakeAgent],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timeout = executor.settings.launch_timeout_s
    slow = Job(
        id="job-slow", name="s", spec=spec(), state=JobState.STARTING, generation=1,
        world_size=2, plan_id="plan-s", transition_started_at=time.time() - 1.5 * timeout,
        workers=[WorkerRecord(rank=0, node_id="n0", state=WorkerState.RUNNING),
                 WorkerRecord(rank=1, node_id="n1", state=WorkerState.LAUNCHING)],
    )  # fmt: skip
    await state.create_job(slow)
    read = record_reads(state, monkeypatch)

    def asks(count: int) -> Callable[[list[object]], bool]:
        return lambda commands: len(starts_of(commands)) >= count

    await executor.reconcile()
    await executor.reconcile()  # the same ask is not made at every tick
    await agents["n1"].wait(asks(1))
    assert read == ["job-slow"]
    later = time.time() + timeout  # one launch timeout on: asked once more
    monkeypatch.setattr("unicron.services.executor.service.now", lambda: later)
    await executor.reconcile()
    await agents["n1"].wait(asks(2))  # a resent id would be dropped by JetStream as a duplicate
    ids = [c.command_id for c in starts_of(agents["n1"].commands)]
    assert ids == ["start:job-slow:1:1:ask1", "start:job-slow:1:1:ask2"]
    assert not starts_of(agents["n0"].commands)  # rank 0 started: it is not asked again


def starts_of(commands: list[object]) -> list[StartWorker]:
    return [c for c in commands if isinstance(c, StartWorker) and c.job_id == "job-slow"]


def record_reads(state: StateStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the job records read from now on, in order."""
    read: list[str] = []
    get_job = state.get_job

    async def recording_get_job(job_id: str) -> Job | None:
        read.append(job_id)
        return await get_job(job_id)

    monkeypatch.setattr(state, "get_job", recording_get_job)
    return read
