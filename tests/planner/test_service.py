"""The planner as a real process against real NATS JetStream and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from shared.bus import Bus, parse_event
from shared.events import CloudEvent, FailureDetected, JobSubmitted, PlanCreated
from shared.models import (
    FailureRecord,
    Job,
    JobSpec,
    JobState,
    NodeRecord,
    Plan,
    PlanAction,
    WorkerRecord,
    WorkerState,
    now,
)
from shared.procs import die_with_parent
from shared.state import StateStore
from shared.taxonomy import FailureCategory, FailureKind, RecoveryAction, Severity

REPO = Path(__file__).resolve().parents[2]
NODES = ("node-a", "node-b")
WAIT_S = 15.0

StartPlanner = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def start_planner(nats_url: str, redis_url: str, tmp_path: Path) -> Iterator[StartPlanner]:
    """Start ``python -m services.planner``; every one started is stopped at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(**settings: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "UNICRON_NATS_URL": nats_url,
            "UNICRON_REDIS_URL": redis_url,
            **{f"UNICRON_{k.upper()}": v for k, v in settings.items()},
        }
        with (tmp_path / f"planner-{len(procs)}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "services.planner"],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    for log in sorted(tmp_path.glob("planner-*.log")):
        print(f"--- {log.name}\n{log.read_text()[-4000:]}")  # shown when a test fails


@pytest.fixture
async def nodes(state: StateStore) -> AsyncIterator[tuple[str, ...]]:
    """Two READY nodes of two slots whose heartbeats stay fresh while the test runs."""
    for node_id in NODES:
        await state.put_node(NodeRecord(id=node_id, slots=2))

    def beat(node: NodeRecord) -> None:
        node.last_heartbeat = now()

    async def heartbeats() -> None:
        while True:
            for node_id in NODES:
                await state.update_node(node_id, beat)
            await asyncio.sleep(0.5)

    task = asyncio.create_task(heartbeats())
    yield NODES
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.fixture
async def plans(bus: Bus) -> asyncio.Queue[PlanCreated]:
    queue: asyncio.Queue[PlanCreated] = asyncio.Queue()

    async def put(event: CloudEvent) -> None:
        data = event.typed()
        assert isinstance(data, PlanCreated)
        await queue.put(data)

    await bus.consume("unicron.events.plan.created", "test-plans", parse_event, put)
    return queue


async def submit(state: StateStore, bus: Bus | None, job_id: str, **spec: int) -> Job:
    """Store a PENDING job and, with a bus, announce it as the API does."""
    job = Job(id=job_id, name=job_id, spec=JobSpec(name=job_id, global_batch=64, **spec))
    await state.create_job(job)
    if bus is not None:
        await bus.publish_event(JobSubmitted(job_id=job.id, name=job.name, spec=job.spec))
    return job


async def next_plan(plans: asyncio.Queue[PlanCreated], state: StateStore) -> Plan:
    event = await asyncio.wait_for(plans.get(), WAIT_S)
    plan = await state.get_plan(event.plan_id)
    assert plan is not None and plan.seq == event.seq
    return plan


def summary(plan: Plan) -> dict[str, tuple[PlanAction, int]]:
    return {a.job_id: (a.action, a.workers) for a in plan.allocations}


async def test_submitted_job_starts_on_two_workers(
    start_planner: StartPlanner,
    nodes: tuple[str, ...],
    state: StateStore,
    bus: Bus,
    plans: asyncio.Queue[PlanCreated],
) -> None:
    start_planner()
    await submit(state, bus, "job-1", min_workers=1, max_workers=2)
    plan = await next_plan(plans, state)
    allocation = plan.for_job("job-1")
    assert allocation is not None
    assert (allocation.action, allocation.workers) == (PlanAction.START, 2)
    assert allocation.nodes == ["node-a", "node-a"]
    assert plan.free_slots == 2
    latest = await state.latest_plan()
    assert latest is not None and latest.id == plan.id


async def test_a_burst_of_submissions_yields_one_plan(
    start_planner: StartPlanner,
    nodes: tuple[str, ...],
    state: StateStore,
    bus: Bus,
    plans: asyncio.Queue[PlanCreated],
) -> None:
    # A job already stored, with no event: the startup pass plans it, and after that plan
    # nothing is pending in the planner (the reconcile tick is pushed out of the way).
    await submit(state, None, "job-0", min_workers=2, max_workers=2)
    start_planner(planner_reconcile_s="60")
    assert summary(await next_plan(plans, state)) == {"job-0": (PlanAction.START, 2)}

    started = time.monotonic()
    for i in range(1, 6):  # each event follows a change in Redis, as from the API
        await submit(state, bus, f"job-{i}", min_workers=1, max_workers=1)
    assert time.monotonic() - started < 0.1
    burst = await next_plan(plans, state)
    assert {j: a for j, (a, _) in summary(burst).items()} == {
        "job-0": PlanAction.START,
        "job-1": PlanAction.START,
        "job-2": PlanAction.START,
        "job-3": PlanAction.WAIT,
        "job-4": PlanAction.WAIT,
        "job-5": PlanAction.WAIT,
    }
    assert "(+" in burst.trigger  # one plan for the whole burst names it so

    # The next plan is the one for a later submission: the burst made no second plan.
    await submit(state, bus, "job-6")
    marker = await next_plan(plans, state)
    assert marker.seq == burst.seq + 1
    assert "job-6" in summary(marker)


async def test_a_faulted_job_is_restarted(
    start_planner: StartPlanner,
    nodes: tuple[str, ...],
    state: StateStore,
    bus: Bus,
    plans: asyncio.Queue[PlanCreated],
) -> None:
    failure = FailureDetected(
        failure_id="fail-1", job_id="job-1", node_id="node-b", rank=1, generation=3,
        kind=FailureKind.EXCEPTION, category=FailureCategory.CUDA_ERROR,
        severity=Severity.SEV2, action=RecoveryAction.RESTART, observed_at=now(),
    )  # fmt: skip
    last_failure = FailureRecord(
        failure_id=failure.failure_id, generation=3, rank=1, node_id="node-b",
        kind=failure.kind.value, category=failure.category.value,
        severity=failure.severity.value, action=failure.action.value,
        observed_at=failure.observed_at,
    )  # fmt: skip
    job = Job(
        id="job-1",
        name="job-1",
        spec=JobSpec(name="job-1", min_workers=1, max_workers=2, global_batch=64),
        state=JobState.RUNNING,
        generation=3,
        world_size=2,
        workers=[
            WorkerRecord(rank=0, node_id="node-b", state=WorkerState.RUNNING),
            WorkerRecord(rank=1, node_id="node-b", state=WorkerState.FAILED),
        ],
        last_failure=last_failure,
    )
    await state.create_job(job)
    start_planner()
    await bus.publish_event(failure)
    allocation = (await next_plan(plans, state)).for_job("job-1")
    assert allocation is not None
    assert (allocation.action, allocation.workers) == (PlanAction.RESTART, 2)
    assert allocation.nodes == ["node-b", "node-b"]  # restarted in place
    assert (allocation.previous_workers, allocation.generation) == (2, 3)
    assert "fail-1" in allocation.reason


async def test_a_restarted_planner_converges(
    start_planner: StartPlanner,
    nodes: tuple[str, ...],
    state: StateStore,
    bus: Bus,
    plans: asyncio.Queue[PlanCreated],
) -> None:
    first = start_planner()
    await submit(state, bus, "job-1", min_workers=2, max_workers=2)
    assert summary(await next_plan(plans, state)) == {"job-1": (PlanAction.START, 2)}

    first.kill()  # SIGKILL: no clean shutdown, the durable consumer stays behind
    await asyncio.to_thread(first.wait)
    await submit(state, bus, "job-2", min_workers=2, max_workers=2)
    start_planner()
    plan = await next_plan(plans, state)
    assert summary(plan) == {"job-1": (PlanAction.START, 2), "job-2": (PlanAction.START, 2)}
    assert sorted(plan.for_job("job-2").nodes) == ["node-b", "node-b"]  # type: ignore[union-attr]
