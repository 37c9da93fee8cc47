"""Failures of a job's own code: counted against max_restarts, carried into last_failure, and
a command that cannot run fails the job at once."""

from __future__ import annotations

import asyncio

from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import JobSpec, JobState
from unicron.shared.contracts.reports import WorkerException
from unicron.shared.store.state import StateStore

from tests.detector.conftest import Cluster, next_event


def value_error(job: str, gen: int, launch_failed: bool = False) -> WorkerException:
    return WorkerException(
        node_id="node-0", job_id=job, generation=gen, rank=0, pid=1000, exc_type="ValueError",
        category="software_other", message="boom at step 5\nKeyError: 'lr'",
        launch_failed=launch_failed,
    )  # fmt: skip


async def test_user_code_fails_the_job_after_max_restarts(
    cluster: Cluster, bus: Bus, state: StateStore, events: asyncio.Queue[CloudEvent]
) -> None:
    await cluster.add_node("node-0")
    spec = JobSpec(name="job-u", entrypoint=["python", "t.py"], max_restarts=1)
    await cluster.add_job("job-u", ["node-0"], generation=1)
    await state.update_job("job-u", lambda j: setattr(j, "spec", spec))
    await bus.publish_report(value_error("job-u", 1))
    first = (await next_event(events, "failure.detected")).data
    assert (first["exc_type"], first["message"]) == ("ValueError", "boom at step 5\nKeyError: 'lr'")
    job = await state.get_job("job-u")
    assert job is not None and job.state == JobState.RECOVERING and job.code_failures == 1
    assert job.last_failure is not None
    assert (job.last_failure.exc_type, job.last_failure.at) == ("ValueError", first["observed_at"])

    await state.update_job("job-u", lambda j: setattr(j, "generation", 2))  # restarted once
    await bus.publish_report(value_error("job-u", 2))
    await next_event(events, "failure.detected")
    job = await state.get_job("job-u")
    assert job is not None and job.state == JobState.FAILED
    reason = job.history[-1].reason
    assert reason.startswith("ValueError: boom at step 5 (rank 0 on node-0)")
    assert "1 restart(s)" in reason


async def test_a_launch_failure_fails_the_job_at_once(
    cluster: Cluster, bus: Bus, state: StateStore, events: asyncio.Queue[CloudEvent]
) -> None:
    await cluster.add_node("node-0")
    spec = JobSpec(name="job-l", entrypoint=["nope"], max_restarts=5)
    await cluster.add_job("job-l", ["node-0"], generation=1)
    await state.update_job("job-l", lambda j: setattr(j, "spec", spec))
    await bus.publish_report(value_error("job-l", 1, launch_failed=True))
    await next_event(events, "failure.detected")
    job = await state.get_job("job-l")
    assert job is not None and job.state == JobState.FAILED
    assert "cannot start" in job.history[-1].reason
