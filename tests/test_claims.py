"""Forged reports are refused by the consumers' claim check, and the job is undisturbed.

NATS permissions keep an agent to its own report subject (tests/test_bus_auth.py); these tests
take the next step, a well-formed report whose claims the job record contradicts, as one that
got past the server would be (a compromised agent lying about another node's worker).
"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError
from unicron.services.executor.progress import ProgressTracker
from unicron.shared.bus.bus import Bus
from unicron.shared.bus.delivery import ClaimRefusedError
from unicron.shared.claims import ReportClaims, refusal, subject_node
from unicron.shared.contracts.messages import DEADLETTER_SUBJECT, DeadLetter
from unicron.shared.contracts.models import Job, JobSpec, JobState, WorkerRecord, WorkerState
from unicron.shared.contracts.reports import (
    REPORT,
    AnyWorkerReport,
    StepCompleted,
    StepsCompleted,
    WorkerExited,
    WorkerStarted,
    report_subject,
)
from unicron.shared.store.state import StateStore

from tests.api.live import eventually


def running_job() -> Job:
    """job-c at generation 2: rank 0 on node-a, rank 1 on node-b, both running."""
    workers = [
        WorkerRecord(rank=0, node_id="node-a", state=WorkerState.RUNNING),
        WorkerRecord(rank=1, node_id="node-b", state=WorkerState.LAUNCHING),
    ]
    job = Job(id="job-c", name="c", spec=JobSpec(name="c", steps=3000), generation=2)
    job.workers = workers
    job.state = JobState.RUNNING
    return job


def exited(node: str, rank: int, generation: int = 2, code: int = 0) -> WorkerExited:
    return WorkerExited(
        node_id=node, job_id="job-c", generation=generation, rank=rank, pid=7, exit_code=code
    )


def test_a_report_must_name_the_node_it_came_from_and_a_seat_of_that_node() -> None:
    job = running_job()
    assert subject_node("unicron.reports.node-a.worker_exited") == "node-a"
    assert refusal(job, exited("node-a", 0), "node-a") is None
    assert refusal(job, exited("node-a", 0, generation=1), "node-a") is None  # history
    refused = {
        "sent as node 'node-b'": (job, exited("node-a", 0), "node-b"),
        "runs on 'node-b', not on 'node-a'": (job, exited("node-a", 1), "node-a"),
        "runs on None": (job, exited("node-a", 5), "node-a"),
        "at generation 2": (job, exited("node-a", 0, generation=3), "node-a"),
        "has no record": (None, exited("node-a", 0), "node-a"),
    }
    for why, args in refused.items():
        assert why in (refusal(*args) or ""), why


async def test_forged_reports_are_dead_lettered_and_the_job_runs_on(
    bus: Bus, state: StateStore
) -> None:
    await state.create_job(running_job())
    letters: asyncio.Queue[DeadLetter] = asyncio.Queue()

    async def letter(item: DeadLetter) -> None:
        await letters.put(item)

    await bus.consume(DEADLETTER_SUBJECT, "test-letters", DeadLetter.model_validate_json, letter)
    progress = ProgressTracker(bus, state)
    claims = ReportClaims(state)
    await bus.consume(
        "unicron.reports.>", "test-executor", REPORT.validate_json,
        progress.on_report, claim=claims.check,
    )  # fmt: skip

    async def send(report: AnyWorkerReport, as_node: str | None = None) -> None:
        subject = report_subject(report)
        if as_node is not None:  # published under another node's subject
            subject = subject.replace(f".{report.node_id}.", f".{as_node}.")
        await bus.js.publish(subject, report.model_dump_json().encode())

    # node-a says rank 1 (node-b's) finished, then both ranks: the job must not succeed
    await send(exited("node-a", 1))
    await send(exited("node-b", 1), as_node="node-a")
    await send(exited("node-a", 0).model_copy(update={"job_id": "job-nobody-submitted"}))
    reasons = [(await asyncio.wait_for(letters.get(), 10)).reason for _ in range(3)]
    assert all(reason.startswith("refused: ") for reason in reasons), reasons
    assert bus.refused == 3

    # an honest report of node-b's own worker is taken
    started = WorkerStarted(node_id="node-b", job_id="job-c", generation=2, rank=1, pid=9)
    await send(started)

    async def rank_1_running() -> bool:
        job = await state.get_job("job-c")
        return job is not None and job.workers[1].state == WorkerState.RUNNING

    await eventually(rank_1_running)
    job = await state.get_job("job-c")
    assert job is not None and job.state == JobState.RUNNING
    assert [w.exit_code for w in job.workers] == [None, None]
    assert letters.empty()


def step(node: str, rank: int, job: str = "job-c", generation: int = 2) -> StepCompleted:
    return StepCompleted(node_id=node, job_id=job, generation=generation, rank=rank, step=4,
                         loss=0.1, iteration_s=0.2)  # fmt: skip


def test_a_node_batches_only_its_own_steps_of_one_generation() -> None:
    StepsCompleted.of([step("node-a", 0), step("node-a", 2)])
    for stranger in (
        step("node-b", 1),
        step("node-a", 1, job="job-d"),
        step("node-a", 1, generation=3),
    ):
        with pytest.raises(ValidationError, match="in a batch of node-a/job-c g2"):
            StepsCompleted.of([step("node-a", 0), stranger])


async def test_a_batch_of_steps_with_a_rank_of_another_node_is_refused(state: StateStore) -> None:
    await state.create_job(running_job())
    claims = ReportClaims(state)
    own = StepsCompleted.of([step("node-a", 0)])
    await claims.check(report_subject(own), own)
    forged = StepsCompleted.of([step("node-a", 0), step("node-a", 1)])  # rank 1 is node-b's
    with pytest.raises(ClaimRefusedError, match="runs on 'node-b', not on 'node-a'"):
        await claims.check(report_subject(forged), forged)
