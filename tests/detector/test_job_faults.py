"""A fault that follows the job is the job's (issue 31): a collective mismatch, and any failure
that comes back after a restart on another node, count toward ``max_restarts`` and end the job
FAILED with the failure named; neither escalates to a node's reconfigure nor counts against a
node. A failure that keeps to one node still escalates; a node's own fault stays the node's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from unicron.services.detector.grading import grade
from unicron.services.detector.settings import DetectorSettings
from unicron.services.detector.signals import Candidate
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import FailureRecord, Job, JobSpec, JobState, now
from unicron.shared.contracts.reports import WorkerException
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind
from unicron.shared.store.state import StateStore

from tests.detector.conftest import Cluster, next_event
from tests.trainer.test_classify import GLOO_MISMATCH

MAX_RESTARTS = 2
# rank → node: two ranks on each node
PLACEMENT = ["node-0", "node-0", "node-1", "node-1"]


def failed(category: str, exc_type: str, message: str) -> Callable[[int, int], WorkerException]:
    """A rank's exception of ``category``, as its agent reports it: (generation, rank) → report."""

    def report(generation: int, rank: int) -> WorkerException:
        return WorkerException(
            node_id=PLACEMENT[rank], job_id="job-m", generation=generation, rank=rank,
            pid=1000 + rank, exc_type=exc_type, message=message, category=category,
        )  # fmt: skip

    return report


# What the agent reads from a plain script's log when gloo aborts it (services/agent/tracebacks).
MISMATCH = failed("collective_mismatch", "gloo::EnforceNotMet", GLOO_MISMATCH)
ILLEGAL = failed("illegal_memory", "AcceleratorError", "CUDA error: an illegal memory access")


async def fail_generations(
    cluster: Cluster,
    bus: Bus,
    state: StateStore,
    events: asyncio.Queue[CloudEvent],
    failures: list[WorkerException],
) -> tuple[list[dict[str, Any]], list[Job]]:
    """Generation N of job-m fails with ``failures[N-1]``, each after the executor restarted the
    job from the one before: the failure.detected of each, and the job after each."""
    for node in ("node-0", "node-1"):
        await cluster.add_node(node)
    spec = JobSpec(name="job-m", entrypoint=["python", "t.py"], max_restarts=MAX_RESTARTS)
    await cluster.add_job("job-m", PLACEMENT, generation=1, spec=spec)
    seen, jobs = [], []
    for report in failures:
        await bus.publish_report(report)
        seen.append((await next_event(events, "failure.detected")).data)
        job = await state.get_job("job-m")
        assert job is not None
        jobs.append(job)
        await state.update_job("job-m", restarted)
    return seen, jobs


def restarted(job: Job) -> bool:
    if job.state.terminal:
        return False
    job.generation += 1
    return True


async def assert_no_node_counted(state: StateStore) -> None:
    """No failure counted toward any node's quarantine: a probe is each node's only one."""
    for node in ("node-0", "node-1"):
        assert await state.record_node_failure(node, "probe", now(), 600.0) == 1, node
        record = await state.get_node(node)
        assert record is not None and record.state.value == "READY"


async def test_a_collective_mismatch_fails_the_job_after_exactly_max_restarts(
    cluster: Cluster, bus: Bus, state: StateStore, events: asyncio.Queue[CloudEvent]
) -> None:
    # The ranks resumed from different steps: gloo aborts rank 3 on node-1 in every generation.
    reports = [MISMATCH(generation, 3) for generation in range(1, MAX_RESTARTS + 2)]
    seen, jobs = await fail_generations(cluster, bus, state, events, reports)
    for failure in seen:  # never escalated, never a node's reconfigure
        assert failure["category"] == "collective_mismatch", failure
        assert (failure["severity"], failure["action"]) == ("SEV2", "restart"), failure
        assert "escalated_from" not in failure["evidence"], failure
    assert [j.state for j in jobs] == [JobState.RECOVERING] * MAX_RESTARTS + [JobState.FAILED]
    assert [j.code_failures for j in jobs] == [1, 2, 3]
    reason = jobs[-1].history[-1].reason
    assert reason.startswith("gloo::EnforceNotMet: [enforce fail at "), reason
    assert "collective mismatch in your code? (rank 3 on node-1)" in reason
    assert "collective_mismatch, the job's own code: failed after 2 restart(s)" in reason
    await assert_no_node_counted(state)


async def test_a_failure_that_comes_back_on_another_node_follows_the_job(
    cluster: Cluster, bus: Bus, state: StateStore, events: asyncio.Queue[CloudEvent]
) -> None:
    # node-0, then node-1, then node-0 again: the same illegal access wherever the job runs.
    reports = [ILLEGAL(1, 0), ILLEGAL(2, 2), ILLEGAL(3, 1)]
    seen, jobs = await fail_generations(cluster, bus, state, events, reports)
    assert [f["follows_job"] for f in seen] == [False, True, True]
    assert [(f["severity"], f["action"]) for f in seen] == [("SEV2", "restart")] * 3
    assert seen[1]["evidence"]["previous_failure"] == seen[0]["failure_id"]
    assert not any("escalated_from" in f["evidence"] for f in seen)
    # The first return counts the failure it came back from too: 2 restarts, as max_restarts.
    assert [j.code_failures for j in jobs] == [0, 2, 3]
    assert jobs[-1].state == JobState.FAILED
    reason = jobs[-1].history[-1].reason
    assert "illegal_memory, it followed the job to other nodes: failed after 2 restart(s)" in reason
    await assert_no_node_counted(state)


async def test_a_failure_that_keeps_to_one_node_still_escalates(
    cluster: Cluster, bus: Bus, state: StateStore, events: asyncio.Queue[CloudEvent]
) -> None:
    reports = [ILLEGAL(1, 0), ILLEGAL(2, 1), ILLEGAL(3, 0)]  # node-0 each time
    seen, jobs = await fail_generations(cluster, bus, state, events, reports)
    assert [f["action"] for f in seen] == ["restart", "reconfigure", "reconfigure"]
    assert [f["follows_job"] for f in seen] == [False] * 3
    assert [j.state for j in jobs] == [JobState.RECOVERING] * 3
    assert [j.code_failures for j in jobs] == [0, 0, 0]


def repeat(category: FailureCategory, node_id: str) -> tuple[Job, Candidate]:
    """Generation 2 of a job, recovering from generation 1's ``category`` on node-0, fails with
    ``category`` again on ``node_id``."""
    last = FailureRecord(
        failure_id="job-g:1", generation=1, kind=FailureKind.EXCEPTION, category=category,
        severity="SEV1", action="reconfigure", node_id="node-0", rank=0, observed_at=now() - 1,
    )  # fmt: skip
    job = Job(id="job-g", name="job-g", spec=JobSpec(name="job-g"), generation=2,
              last_failure=last)  # fmt: skip
    cause = Candidate("job-g", 2, node_id, 2, FailureKind.EXCEPTION, category, now())
    return job, cause


@pytest.mark.parametrize("category", [FailureCategory.ECC, FailureCategory.NVLINK])
def test_a_node_s_own_fault_on_another_node_is_that_node_s(category: FailureCategory) -> None:
    graded = grade(*repeat(category, "node-1"), DetectorSettings(), drilled=False)
    assert (graded.action.value, graded.follows_job) == ("reconfigure", False)


def test_a_drill_s_fault_follows_nobody() -> None:
    job, cause = repeat(FailureCategory.CUDA_ERROR, "node-1")
    assert grade(job, cause, DetectorSettings(), drilled=False).follows_job
    assert not grade(job, cause, DetectorSettings(), drilled=True).follows_job
