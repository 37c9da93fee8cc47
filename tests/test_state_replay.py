"""The records a lost Redis had, rebuilt from the event stream and the agents' inventories:
events in, job records out (no servers)."""

from __future__ import annotations

from unicron.services.executor.adopt import SeatTrace, adopt, note_report, orphan_stops
from unicron.shared.contracts.events import (
    CloudEvent,
    EventData,
    FailureDetected,
    JobStateChanged,
    JobSubmitted,
    NodeJoined,
    NodeLost,
    NodeStateChanged,
    PlanCreated,
    TransitionCompleted,
    TransitionStarted,
)
from unicron.shared.contracts.models import (
    Job,
    JobSpec,
    JobState,
    NodeRecord,
    NodeState,
    NodeWorker,
    PlanAction,
    WorkerRecord,
    WorkerState,
)
from unicron.shared.contracts.reports import WorkerExited, WorkerStarted
from unicron.shared.contracts.taxonomy import (
    FailureCategory,
    FailureKind,
    RecoveryAction,
    Severity,
    severity_of,
)
from unicron.shared.store.replay import replay

P, R, S = JobState.PENDING, JobState.RUNNING, JobState.STARTING
SPEC = JobSpec(name="a", steps=100, min_workers=1, max_workers=2)


def wrap(*items: EventData) -> list[CloudEvent]:
    return [CloudEvent.wrap(item, "unicron/test") for item in items]


def changed(
    job_id: str, old: JobState, new: JobState, generation: int, step: int = 0
) -> JobStateChanged:
    return JobStateChanged(
        job_id=job_id, old=old, new=new, reason=f"to {new.value}", step=step, generation=generation
    )


def started(
    job_id: str, plan: str, action: PlanAction, generation: int, workers: int = 2
) -> TransitionStarted:
    return TransitionStarted(
        job_id=job_id,
        plan_id=plan,
        action=action,
        generation=generation,
        from_workers=0,
        to_workers=workers,
    )


def completed(job_id: str, generation: int) -> TransitionCompleted:
    return TransitionCompleted(
        job_id=job_id,
        action=PlanAction.START,
        generation=generation,
        world_size=2,
        resumed_step=0,
        duration_s=1.0,
        kind="checkpoint",
    )


def crash(job_id: str, generation: int) -> FailureDetected:
    return FailureDetected(
        failure_id=f"{job_id}:{generation}",
        job_id=job_id,
        node_id="n1",
        rank=1,
        generation=generation,
        kind=FailureKind.CRASH,
        category=FailureCategory.EXITED_ABNORMALLY,
        severity=Severity.SEV2,
        action=RecoveryAction.RESTART,
        observed_at=1.0,
    )


def history_of_a_recovered_job() -> list[CloudEvent]:
    return wrap(
        NodeJoined(node_id="n0", slots=2, host="h", boot_id="b0"),
        NodeJoined(node_id="n1", slots=2, host="h", boot_id="b1"),
        NodeJoined(node_id="gone", slots=2, host="h", boot_id="b2"),
        NodeLost(node_id="gone", boot_id="b2", last_heartbeat=1.0),
        JobSubmitted(job_id="a", name="a", spec=SPEC, tenant="team-a"),
        PlanCreated(plan_id="p1", seq=1, epoch=1, trigger="t", expected_waf=1.0, jobs=[]),
        started("a", "p1", PlanAction.START, 1),
        changed("a", P, S, 1),
        changed("a", S, R, 1, step=1),
        completed("a", 1),
        crash("a", 1),
        changed("a", R, JobState.RECOVERING, 1, step=30),
        PlanCreated(plan_id="p2", seq=7, epoch=3, trigger="t", expected_waf=1.0, jobs=[]),
        started("a", "p2", PlanAction.RESTART, 2),
        started("a", "p2", PlanAction.RESTART, 3),  # the in-place attempt fell back
        changed("a", JobState.RECOVERING, R, 3, step=31),
        changed("a", R, JobState.RECOVERING, 1, step=2),  # a late copy of gen 1's news
        JobSubmitted(job_id="b", name="b", spec=SPEC),
        changed("b", P, JobState.CANCELLED, 0),
        changed("b", JobState.CANCELLED, R, 0),  # nothing resurrects a finished job
        changed("ghost", P, R, 1),  # submitted before the stream began: nothing to rebuild
    )


def test_the_stream_rebuilds_each_job_and_the_counters() -> None:
    cluster = replay(history_of_a_recovered_job())
    a, b = cluster.jobs["a"], cluster.jobs["b"]
    assert (a.name, a.spec, a.tenant) == ("a", SPEC, "team-a")
    assert (a.state, a.generation, a.world_size, a.step, a.plan_id) == (R, 3, 2, 31, "p2")
    assert a.recoveries == 1  # one restart plan; its fallback is not another recovery
    assert (a.transition_kind, a.transition_fallback) == (
        "checkpoint",
        "in-place transition failed",
    )
    assert a.last_failure is not None and a.last_failure.generation == 1
    assert not a.needs_recovery()
    assert [h.state for h in a.history] == [P, S, R, JobState.RECOVERING, R]
    assert b.state == JobState.CANCELLED and b.stepping
    assert (cluster.plan_seq, cluster.planner_epoch) == (7, 3)
    assert cluster.expected_nodes == {"n0", "n1"}
    assert cluster.unknown_jobs == {"ghost"}


def running_job(generation: int = 3) -> Job:
    job = replay(history_of_a_recovered_job()).jobs["a"]
    assert job.generation == generation
    return job


def node(node_id: str, *workers: tuple[str, int, int], heartbeat: float = 100.0) -> NodeRecord:
    inventory = [NodeWorker(job_id=j, generation=g, rank=r, pid=1000 + r) for j, g, r in workers]
    return NodeRecord(id=node_id, slots=2, last_heartbeat=heartbeat, workers=inventory)


def test_running_workers_are_re_adopted_and_the_job_goes_on() -> None:
    job = adopt(running_job(), [node("n0", ("a", 3, 0)), node("n1", ("a", 3, 1))], {}, at=101.0)
    assert job.state == R and not job.needs_recovery()
    assert [(w.rank, w.node_id, w.state, w.pid) for w in job.workers] == [
        (0, "n0", WorkerState.RUNNING, 1000),
        (1, "n1", WorkerState.RUNNING, 1001),
    ]


def test_a_rank_gone_without_a_trace_is_recovered_from() -> None:
    before = running_job()
    job = adopt(before.model_copy(deep=True), [node("n0", ("a", 3, 0)), node("n1")], {}, at=101.0)
    assert job.state == JobState.RECOVERING and job.needs_recovery()
    failure = job.last_failure
    assert failure is not None and failure.rank == 1
    assert job.workers[1].state == WorkerState.FAILED
    # as severe, and answered, as the taxonomy says of its category: what the planner acts on
    assert failure.category == FailureCategory.EXITED_ABNORMALLY
    assert (failure.severity, failure.action) == severity_of(failure.category)
    assert (failure.severity, failure.action) == (Severity.SEV2, RecoveryAction.RESTART)
    # the rebuild announces the move with the reason the job's history gives
    reason = "rebuild: rank(s) 1 of generation 3 lost"
    assert JobStateChanged.between(before.state, job) == JobStateChanged(
        job_id="a", old=R, new=JobState.RECOVERING, reason=reason, step=31, generation=3
    )


def test_ranks_that_all_exited_zero_mean_success_and_later_facts_win() -> None:
    traces: dict[tuple[str, int, int], SeatTrace] = {}
    for rank, node_id in enumerate(("n0", "n1")):
        common = {"node_id": node_id, "job_id": "a", "generation": 3, "rank": rank, "pid": 7}
        note_report(traces, WorkerStarted(**common, at=50.0))
        note_report(traces, WorkerExited(**common, exit_code=0, at=150.0))
    # the inventory (heartbeat at 100) still lists rank 0, but its exit came after
    job = adopt(running_job(), [node("n0", ("a", 3, 0)), node("n1")], traces, at=151.0)
    assert job.state == JobState.SUCCEEDED
    assert [w.state for w in job.workers] == [WorkerState.SUCCEEDED] * 2


def test_a_start_newer_than_the_inventory_counts_as_running() -> None:
    traces: dict[tuple[str, int, int], SeatTrace] = {}
    report = WorkerStarted(node_id="n1", job_id="a", generation=3, rank=1, pid=9, at=120.0)
    note_report(traces, report)
    job = adopt(running_job(), [node("n0", ("a", 3, 0)), node("n1")], traces, at=121.0)
    assert job.state == R and job.workers[1].state == WorkerState.RUNNING


def test_an_inventory_ahead_of_the_stream_raises_the_generation() -> None:
    job = adopt(running_job(), [node("n0", ("a", 4, 0)), node("n1", ("a", 4, 1))], {}, at=1.0)
    assert (job.generation, job.world_size, job.state) == (4, 2, R)


def test_workers_no_current_generation_claims_are_orphans() -> None:
    jobs = {"a": running_job(), "b": replay(history_of_a_recovered_job()).jobs["b"]}
    nodes = [node("n0", ("a", 3, 0), ("a", 2, 1)), node("n1", ("x", 1, 0), ("b", 0, 0))]
    stops = [(s.node_id, s.job_id, s.below) for s in orphan_stops(nodes, jobs)]
    assert stops == [("n0", "a", 3), ("n1", "b", None), ("n1", "x", None)]
    # …but not a survivor about to re-form into the current generation
    jobs["a"].workers = [WorkerRecord(rank=0, node_id="n0", from_generation=2, from_rank=1)]
    assert [s.job_id for s in orphan_stops(nodes, jobs)] == ["b", "x"]


def test_a_quarantine_the_stream_ends_with_is_remembered() -> None:
    def change(new: NodeState, until: float | None = None) -> NodeStateChanged:
        return NodeStateChanged(node_id="n0", old=NodeState.READY, new=new, until=until)

    assert replay(wrap(change(NodeState.QUARANTINED, 500.0))).quarantined == {"n0": 500.0}
    lifted = wrap(change(NodeState.QUARANTINED, 500.0), change(NodeState.READY))
    assert replay(lifted).quarantined == {}


def test_a_failure_that_followed_the_job_is_counted_as_the_detector_counted_it() -> None:
    # Generation 1 failed on n1; generations 2 and 3 failed the same way elsewhere. The first
    # return counts the failure it came back from too (services/detector/record.py).
    returns = [
        crash("a", generation).model_copy(update={"node_id": node, "follows_job": True})
        for generation, node in ((2, "n0"), (3, "n1"))
    ]
    events = wrap(
        JobSubmitted(job_id="a", name="a", spec=SPEC),
        started("a", "p1", PlanAction.START, 1),
        crash("a", 1),
        started("a", "p1", PlanAction.RESTART, 2),
        returns[0],
        started("a", "p1", PlanAction.RESTART, 3),
        returns[1],
    )
    job = replay(events).jobs["a"]
    assert job.code_failures == 3
    assert job.last_failure is not None and job.last_failure.follows_job
