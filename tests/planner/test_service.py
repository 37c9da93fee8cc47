"""The planner as a real process against real NATS JetStream and Redis."""

from __future__ import annotations

import asyncio
import time

from unicron.shared.contracts.events import FailureDetected, NodeStateChanged
from unicron.shared.contracts.models import (
    FailureRecord,
    Job,
    JobSpec,
    JobState,
    NodeRecord,
    NodeState,
    PlanAction,
    WorkerRecord,
    WorkerState,
    now,
)
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind, RecoveryAction, Severity

from tests.planner.live import Live, summary


async def test_submitted_job_starts_on_two_workers(live: Live) -> None:
    live.start_planner()
    await live.submit("job-1", min_workers=1, max_workers=2)
    plan = await live.next_plan()
    allocation = plan.for_job("job-1")
    assert allocation is not None
    assert (allocation.action, allocation.workers) == (PlanAction.START, 2)
    assert allocation.nodes == ["node-a", "node-a"]
    assert plan.free_slots == 2
    latest = await live.state.latest_plan()
    assert latest is not None and latest.id == plan.id


async def test_a_burst_of_submissions_yields_one_plan(live: Live) -> None:
    # A job already stored, with no event: the startup pass plans it, and after that plan
    # nothing is pending in the planner (the reconcile tick is pushed out of the way). Two
    # workers earn less than twice one (the all-reduce), so job-0 keeps its slots over two
    # one-worker jobs only by weight.
    await live.submit("job-0", announce=False, min_workers=2, max_workers=2, weight=2.0)
    # A debounce wider than the default 0.1 s: five submissions must fit in it on a loaded
    # machine too, and the test checks the coalescing, not the default window.
    live.start_planner(planner_reconcile_s="60", planner_debounce_s="0.5")
    assert summary(await live.next_plan()) == {"job-0": (PlanAction.START, 2)}

    started = time.monotonic()
    for i in range(1, 6):  # each event follows a change in Redis, as from the API
        await live.submit(f"job-{i}", min_workers=1, max_workers=1)
    assert time.monotonic() - started < 0.5
    burst = await live.next_plan()
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
    await live.submit("job-6")
    marker = await live.next_plan()
    assert marker.seq == burst.seq + 1
    assert "job-6" in summary(marker)


async def test_a_faulted_job_is_restarted(live: Live) -> None:
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
    await live.state.create_job(job)
    live.start_planner()
    await live.bus.publish_event(failure)
    allocation = (await live.next_plan()).for_job("job-1")
    assert allocation is not None
    assert (allocation.action, allocation.workers) == (PlanAction.RESTART, 2)
    assert allocation.nodes == ["node-b", "node-b"]  # restarted in place
    assert (allocation.previous_workers, allocation.generation) == (2, 3)
    assert "fail-1" in allocation.reason


async def test_a_restarted_planner_converges(live: Live) -> None:
    first = live.start_planner(planner_lease_ttl_s="1")  # the successor waits out its lease
    await live.submit("job-1", min_workers=2, max_workers=2)
    assert summary(await live.next_plan()) == {"job-1": (PlanAction.START, 2)}

    first.kill()  # SIGKILL: no clean shutdown, the durable consumer stays behind
    await asyncio.to_thread(first.wait)
    await live.submit("job-2", min_workers=2, max_workers=2)
    live.start_planner(planner_lease_ttl_s="1")
    plan = await live.next_plan()
    assert summary(plan) == {"job-1": (PlanAction.START, 2), "job-2": (PlanAction.START, 2)}
    assert sorted(plan.for_job("job-2").nodes) == ["node-b", "node-b"]  # type: ignore[union-attr]


async def test_a_node_back_from_quarantine_is_planned_at_once(live: Live) -> None:
    def quarantine(node: NodeRecord) -> None:
        node.state = NodeState.QUARANTINED

    await live.state.update_node("node-b", quarantine)
    live.start_planner(planner_reconcile_s="60")  # only the event can wake it in time
    await live.submit("job-1", min_workers=1, max_workers=4)
    first = await live.next_plan()
    assert first.for_job("job-1").nodes == ["node-a", "node-a"]  # type: ignore[union-attr]

    def release(node: NodeRecord) -> None:
        node.state = NodeState.READY

    await live.state.update_node("node-b", release)
    ended = NodeStateChanged(
        node_id="node-b", old=NodeState.QUARANTINED, new=NodeState.READY, reason="cooldown over"
    )
    await live.bus.publish_event(ended)
    plan = await live.next_plan()
    assert "node.state_changed node-b" in plan.trigger
    assert sorted(plan.for_job("job-1").nodes) == ["node-a"] * 2 + ["node-b"] * 2  # type: ignore[union-attr]
