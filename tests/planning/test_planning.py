"""From Redis records to a plan: actions, reasons, stability. Pure: no servers."""

from __future__ import annotations

from unicron.planning.api import Objective
from unicron.planning.costs import ConstantDowntime
from unicron.planning.planning import PlanDraft, needs_publish, plan_cluster, snapshot
from unicron.planning.throughput import LinearThroughput
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
)
from unicron.shared.contracts.plans import JobAllocation, Plan, WaitReason

NOW = 10_000.0
OBJECTIVE = Objective(LinearThroughput(), ConstantDowntime(10.0, 10.0, 0.0), run_s=3600.0)


def node(node_id: str, slots: int = 2, state: NodeState = NodeState.READY) -> NodeRecord:
    return NodeRecord(id=node_id, slots=slots, last_heartbeat=NOW, state=state)


def job(
    job_id: str,
    lo: int = 1,
    hi: int = 2,
    weight: float = 1.0,
    state: JobState = JobState.PENDING,
    ranks: tuple[str, ...] = (),
    failed: bool = False,
) -> Job:
    spec = JobSpec(name=job_id, min_workers=lo, max_workers=hi, weight=weight, global_batch=64)
    running = state != JobState.PENDING
    workers = [
        WorkerRecord(rank=r, node_id=n, state=WorkerState.RUNNING) for r, n in enumerate(ranks)
    ]
    failure = FailureRecord(
        failure_id="f-1", generation=1, kind="exception", category="cuda_error",
        severity="SEV2", action="restart", rank=0, node_id=ranks[0] if ranks else None,
        observed_at=NOW,
    )  # fmt: skip
    return Job(
        id=job_id,
        name=job_id,
        spec=spec,
        state=state,
        generation=1 if running else 0,
        world_size=len(ranks),
        workers=workers,
        last_failure=failure if failed else None,
        submitted_at=NOW - 100 + int(job_id[-1]),  # job-1 before job-2 …
    )


def plan(nodes: list[NodeRecord], jobs: list[Job], objective: Objective = OBJECTIVE) -> PlanDraft:
    return plan_cluster(snapshot(nodes, jobs, NOW), objective)


def by_job(draft: PlanDraft) -> dict[str, JobAllocation]:
    return {a.job_id: a for a in draft.allocations}


def execute(draft: PlanDraft, jobs: list[Job]) -> list[Job]:
    """What the executor will do: each placed job runs its ranks where the plan put them."""
    after = []
    for j in jobs:
        a = by_job(draft)[j.id]
        if a.workers:
            j = job(j.id, j.spec.min_workers, j.spec.max_workers, j.spec.weight,
                    JobState.RUNNING, tuple(a.nodes))  # fmt: skip
        after.append(j)
    return after


def test_two_jobs_start_on_two_nodes_and_a_third_waits() -> None:
    nodes = [node("node-a"), node("node-b")]
    jobs = [job("job-1"), job("job-2"), job("job-3")]
    got = by_job(plan(nodes, jobs))
    assert (got["job-1"].action, got["job-1"].nodes) == (PlanAction.START, ["node-a", "node-a"])
    assert (got["job-2"].action, got["job-2"].nodes) == (PlanAction.START, ["node-b", "node-b"])
    assert (got["job-3"].action, got["job-3"].workers) == (PlanAction.WAIT, 0)
    assert got["job-1"].predicted_throughput == 2.0


def test_replanning_an_unchanged_cluster_changes_nothing() -> None:
    nodes = [node("node-a"), node("node-b"), node("node-c", 3)]
    jobs = [job("job-1", hi=3), job("job-2", lo=2, hi=4), job("job-3", lo=4, hi=8)]
    first = plan(nodes, jobs)
    running = execute(first, jobs)
    again = plan(nodes, running)
    actions = {a.job_id: a.action for a in again.allocations}
    assert actions == {"job-1": PlanAction.KEEP, "job-2": PlanAction.KEEP, "job-3": PlanAction.WAIT}
    assert [a.nodes for a in again.allocations] == [a.nodes for a in first.allocations]
    published = Plan(allocations=first.allocations)
    assert not needs_publish(again, published)
    assert not needs_publish(plan(nodes, running), Plan(allocations=again.allocations))


def test_transition_cost_keeps_a_job_when_growing_gains_less() -> None:
    nodes = [node("node-a"), node("node-b")]
    jobs = [job("job-1", hi=4, state=JobState.RUNNING, ranks=("node-a", "node-a"))]
    short_run = Objective(LinearThroughput(), ConstantDowntime(10.0, 10.0, 0.0), run_s=5.0)
    assert by_job(plan(nodes, jobs, short_run))["job-1"].action == PlanAction.KEEP
    grown = by_job(plan(nodes, jobs))["job-1"]  # D_run = 1 h pays for the 10 s resize
    assert (grown.action, grown.workers, grown.previous_workers) == (PlanAction.RESIZE, 4, 2)
    assert grown.nodes == ["node-a", "node-a", "node-b", "node-b"]


def test_a_faulted_job_restarts_in_place() -> None:
    jobs = [job("job-1", state=JobState.RUNNING, ranks=("node-b", "node-b"), failed=True)]
    got = by_job(plan([node("node-a"), node("node-b")], jobs))["job-1"]
    assert (got.action, got.workers, got.nodes) == (PlanAction.RESTART, 2, ["node-b", "node-b"])
    assert "f-1" in got.reason


def test_a_lost_node_moves_or_shrinks_the_job() -> None:
    nodes = [node("node-a"), node("node-b", state=NodeState.LOST), node("node-c", 1)]
    moved = by_job(plan(nodes, [job("job-1", state=JobState.RUNNING, ranks=("node-a", "node-b"))]))
    assert (moved["job-1"].action, moved["job-1"].nodes) == (PlanAction.RESTART, ["node-a"] * 2)
    big = job("job-1", hi=4, state=JobState.RUNNING, ranks=("node-b", "node-b", "node-a", "node-a"))
    shrunk = by_job(plan(nodes, [big]))["job-1"]
    assert (shrunk.action, shrunk.workers) == (PlanAction.RESIZE, 3)
    assert shrunk.nodes == ["node-a", "node-a", "node-c"]
    assert "lost a node" in shrunk.reason


def test_a_heavier_job_preempts_and_a_cancelled_job_is_stopped() -> None:
    nodes = [node("node-a"), node("node-b")]
    cancelled = job("job-3", state=JobState.RUNNING, ranks=("node-b", "node-b"))
    cancelled.state = JobState.CANCELLED
    jobs = [job("job-1", hi=2, state=JobState.RUNNING, ranks=("node-a", "node-a")),
            job("job-2", lo=4, hi=4, weight=3.0), cancelled]  # fmt: skip
    got = by_job(plan(nodes, jobs))
    assert (got["job-1"].action, got["job-1"].workers) == (PlanAction.STOP, 0)
    assert "preempted" in got["job-1"].reason
    assert (got["job-2"].action, got["job-2"].workers) == (PlanAction.START, 4)
    assert (got["job-3"].action, got["job-3"].previous_workers) == (PlanAction.STOP, 2)


def test_ties_go_to_the_earlier_job_unless_a_job_keeps_its_slots() -> None:
    nodes = [node("node-a", 4)]
    twins = [job("job-1", lo=4, hi=4), job("job-2", lo=4, hi=4)]
    got = by_job(plan(nodes, twins))
    assert (got["job-1"].action, got["job-2"].action) == (PlanAction.START, PlanAction.WAIT)
    free = Objective(LinearThroughput(), ConstantDowntime(0.0, 0.0, 0.0), run_s=3600.0)
    running = [job("job-1", lo=4, hi=4), job("job-2", 4, 4, state=JobState.RUNNING,
                                             ranks=("node-a",) * 4)]  # fmt: skip
    got = by_job(plan(nodes, running, free))
    assert (got["job-1"].action, got["job-2"].action) == (PlanAction.WAIT, PlanAction.KEEP)


def test_unusable_nodes_and_too_big_jobs() -> None:
    nodes = [node("node-a"), node("node-b", state=NodeState.LOST),
             node("node-c", state=NodeState.DRAINED)]  # fmt: skip
    draft = plan(nodes, [job("job-1", lo=3, hi=3)])
    assert draft.free_slots == 2
    got = by_job(draft)["job-1"]
    assert got.reason == (
        "needs 3 workers, 2 slots usable; out of service: node-b LOST, node-c DRAINED (4 slots)"
    )
    assert got.waiting_reason == WaitReason.NODES_UNAVAILABLE


def test_a_ready_node_with_old_heartbeats_is_kept_until_the_detector_says_lost() -> None:
    # Right after a Redis outage every record's last beat is old while every agent is fine:
    # a planner judging silence itself would preempt every job (found by bench/chaos.py).
    stale = [n.model_copy(update={"last_heartbeat": NOW - 60}) for n in (node("a"), node("b"))]
    running = job("job-1", state=JobState.RUNNING, ranks=("a", "b"))
    assert by_job(plan(stale, [running]))["job-1"].action == PlanAction.KEEP


def test_publishes_only_news() -> None:
    nodes = [node("node-a")]
    waiting = plan(nodes, [job("job-1", lo=4, hi=4)])
    assert not needs_publish(waiting, None)
    starting = plan(nodes, [job("job-1")])
    assert needs_publish(starting, None)
    assert not needs_publish(starting, Plan(allocations=starting.allocations))
