"""The executor's reconcile reads job summaries, and the record of a job only when its summary
says there is something to do: workers asked to start that never did are asked for again."""

from __future__ import annotations

import time

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
    read: list[str] = []
    get_job = state.get_job

    async def recording_get_job(job_id: str) -> Job | None:
        read.append(job_id)
        return await get_job(job_id)

    monkeypatch.setattr(state, "get_job", recording_get_job)
    monkeypatch.setattr(state, "list_jobs", None)  # a scan of every record would fail here

    await executor.reconcile()

    def started(commands: list[object]) -> bool:
        return any(isinstance(c, StartWorker) and c.job_id == "job-starting" for c in commands)

    await agents["n0"].wait(started)
    await agents["n1"].wait(started)
    assert read == ["job-starting"]
