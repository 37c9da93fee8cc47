"""One vocabulary per concept (issue 12, item 2): the map between a failure's action, the
planner's kind of transition, the plan's action and the executor's mode has no gap, says what
docs/design.md §5 says, and agrees with what the planner decides; the values on the bus and in
Redis are the strings they always were; an unknown failure category is still recovered from."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from unicron.planning.api import Objective
from unicron.planning.costs import ConstantDowntime
from unicron.planning.planning import plan_cluster, snapshot
from unicron.planning.throughput import LinearThroughput
from unicron.services.detector.signals import from_exception
from unicron.services.executor.completion import _state_source
from unicron.shared.contracts.events import FailureDetected
from unicron.shared.contracts.models import (
    FailureRecord,
    Job,
    JobSpec,
    JobState,
    NodeRecord,
    NodeState,
    WorkerRecord,
    WorkerState,
)
from unicron.shared.contracts.reports import (
    WORKER_REPORT,
    StepCompleted,
    WorkerException,
    WorkerRegrouped,
)
from unicron.shared.contracts.taxonomy import (
    FailureCategory,
    FailureKind,
    RecoveryAction,
    Severity,
    severity_of,
)
from unicron.shared.contracts.transitions import (
    CARRIED_BY_KIND,
    IN_PLACE_ACTIONS,
    LAUNCHES,
    QUIET,
    PlanAction,
    StateSource,
    TransitionKind,
    TransitionMode,
    answer_to,
    kinds_of,
)

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
IDS = {"node_id": "n1", "job_id": "job-a", "generation": 1, "rank": 0}


# --- the map -------------------------------------------------------------------------------


def test_every_member_of_each_vocabulary_is_mapped() -> None:
    rows = CARRIED_BY_KIND.values()
    assert set(CARRIED_BY_KIND) == set(TransitionKind)
    assert set().union(*(r.plan for r in rows)) == set(PlanAction)
    assert set().union(*(r.modes for r in rows)) == set(TransitionMode)
    answered = [action for r in rows for action in r.answers]
    assert sorted(answered) == sorted(RecoveryAction)  # each by exactly one kind


def test_a_failure_is_answered_by_a_kind_its_plan_action_carries() -> None:
    # on its own nodes and size a failed job is restarted; an advisory one keeps running
    assert {a: answer_to(a) for a in RecoveryAction} == {
        RecoveryAction.REATTEMPT: TransitionKind.REATTEMPT,
        RecoveryAction.RESTART: TransitionKind.RESTART,
        RecoveryAction.RECONFIGURE: TransitionKind.RESTART,
        RecoveryAction.REPORT: TransitionKind.NONE,
    }
    assert answer_to(RecoveryAction.RESTART) in kinds_of(PlanAction.RESTART)
    assert answer_to(RecoveryAction.REPORT) in kinds_of(PlanAction.KEEP)


def test_the_executor_launches_and_keeps_survivors_as_before() -> None:
    assert {PlanAction.START, PlanAction.RESTART, PlanAction.RESIZE} == LAUNCHES
    assert {PlanAction.RESTART, PlanAction.RESIZE} == IN_PLACE_ACTIONS
    assert {PlanAction.KEEP, PlanAction.WAIT} == QUIET


def _design_table() -> dict[str, tuple[set[str], set[str], set[str]]]:
    text = DESIGN.read_text().split("## 5. Transitions", 1)[1].split("\n## ", 1)[0]
    header = "| kind | plan action | executor | answers |"
    lines = text.split(header, 1)[1].strip().splitlines()[1:]

    def cell(value: str) -> set[str]:
        return set() if value.strip() == "—" else {v.strip() for v in value.split(",")}

    table = {}
    for line in lines:
        if not line.startswith("|"):
            break
        kind, plan, modes, answers = line.strip("|").split("|")
        table[kind.strip()] = (cell(plan), cell(modes), cell(answers))
    return table


def test_the_design_documents_the_map() -> None:
    assert _design_table() == {
        kind.value: (
            {a.value for a in row.plan},
            {m.value for m in row.modes},
            {a.value for a in row.answers},
        )
        for kind, row in CARRIED_BY_KIND.items()
    }


# --- the planner keeps to it ----------------------------------------------------------------

NOW = 10_000.0
OBJECTIVE = Objective(LinearThroughput(), ConstantDowntime(10.0, 10.0, 0.0), run_s=3600.0)
NODES = ("node-a", "node-b", "node-c")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[NodeRecord], list[Job]]:
    lost = draw(st.sets(st.sampled_from(NODES), max_size=1))
    nodes = [
        NodeRecord(id=n, slots=2, last_heartbeat=NOW,
                   state=NodeState.LOST if n in lost else NodeState.READY)
        for n in NODES
    ]  # fmt: skip
    free = [n for n in NODES for _ in range(2)]  # each node's 2 slots, held by one rank each
    jobs = []
    for i in range(draw(st.integers(1, 3))):
        lo = draw(st.integers(1, 2))
        held = draw(st.lists(st.integers(0, len(free) - 1), max_size=min(3, len(free)),
                             unique=True)) if free else []  # fmt: skip
        ranks = [free[k] for k in held]
        free = [n for k, n in enumerate(free) if k not in held]
        action = draw(st.none() | st.sampled_from(list(RecoveryAction)))
        jobs.append(_job(f"job-{i}", lo, lo + draw(st.integers(0, 3)), ranks, action))
    return nodes, jobs


def _job(job_id: str, lo: int, hi: int, ranks: list[str], action: RecoveryAction | None) -> Job:
    workers = [
        WorkerRecord(rank=r, node_id=n, state=WorkerState.RUNNING) for r, n in enumerate(ranks)
    ]
    failure = None
    if action is not None and ranks:
        failure = FailureRecord(
            failure_id=f"{job_id}:1", generation=1, kind=FailureKind.EXCEPTION,
            category=FailureCategory.CUDA_ERROR, severity=Severity.SEV2, action=action,
            rank=0, node_id=ranks[0], observed_at=NOW,
        )  # fmt: skip
    return Job(
        id=job_id, name=job_id, spec=JobSpec(name=job_id, min_workers=lo, max_workers=hi),
        state=JobState.RUNNING if ranks else JobState.PENDING, generation=1 if ranks else 0,
        world_size=len(ranks), workers=workers, last_failure=failure,
        submitted_at=NOW - 100 + int(job_id[-1]),
    )  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_a_plans_action_carries_the_kind_of_transition_it_priced(
    cluster: tuple[list[NodeRecord], list[Job]],
) -> None:
    nodes, jobs = cluster
    for allocation in plan_cluster(snapshot(nodes, jobs, NOW), OBJECTIVE).allocations:
        assert allocation.explanation is not None
        kind = TransitionKind(allocation.explanation.transition)
        assert kind in kinds_of(allocation.action), (allocation.action, kind, allocation.reason)


# --- state sources --------------------------------------------------------------------------


def test_state_sources_travel_as_the_strings_they_were() -> None:
    assert [s.value for s in StateSource] == ["none", "memory", "peer", "checkpoint_memory", "disk"]
    report = WorkerRegrouped(**IDS, pid=1, world_size=2, regroup_s=0.1, state_source="peer",
                             resumed_step=4)  # fmt: skip
    assert json.loads(report.model_dump_json())["state_source"] == "peer"
    assert WORKER_REPORT.validate_json(report.model_dump_json()) == report


def _regrouped(sources: list[StateSource], mode: TransitionMode, joiner: bool = False) -> Job:
    workers = [
        WorkerRecord(rank=r, node_id="n1", state=WorkerState.RUNNING, regrouped_at=NOW,
                     state_source=s, resumed_step=5, from_generation=1, from_rank=r)
        for r, s in enumerate(sources)
    ]  # fmt: skip
    if joiner:
        workers.append(WorkerRecord(rank=len(workers), node_id="n1", state=WorkerState.RUNNING))
    return Job(id="job-a", name="a", spec=JobSpec(name="a"), generation=2,
               workers=workers, transition_kind=mode)  # fmt: skip


def test_the_farthest_source_any_rank_used_names_the_transition() -> None:
    step = StepCompleted(**IDS, step=5, loss=0.1, iteration_s=0.1)
    source = _state_source
    mem, disk = StateSource.MEMORY, StateSource.DISK
    assert source(_regrouped([mem, mem], TransitionMode.IN_PLACE), step)[0] == mem
    assert source(_regrouped([mem, disk], TransitionMode.IN_PLACE), step)[0] == disk
    joined = _regrouped([mem], TransitionMode.IN_PLACE, joiner=True)
    assert source(joined, step)[0] == StateSource.PEER
    assert StateSource.farthest([]) is None


# --- failures -------------------------------------------------------------------------------


def test_a_failure_record_lies_in_redis_as_the_strings_it_was() -> None:
    stored = {
        "failure_id": "f", "generation": 1, "kind": "exception", "category": "oom",
        "severity": "SEV2", "action": "restart", "observed_at": NOW,
    }  # fmt: skip
    record = FailureRecord.model_validate(stored)
    assert (record.category, record.action) == (FailureCategory.OOM, RecoveryAction.RESTART)
    again = json.loads(record.model_dump_json())
    assert {k: again[k] for k in stored} == stored


def test_a_failure_is_as_severe_as_the_taxonomy_says_unless_the_detector_graded_it() -> None:
    seen = {"failure_id": "f", "job_id": "job-a", "node_id": "n1", "rank": 0, "generation": 1,
            "kind": FailureKind.EXCEPTION, "observed_at": NOW}  # fmt: skip
    for category in FailureCategory:
        failure = FailureDetected.of(category, **seen)
        assert (failure.severity, failure.action) == severity_of(category)
    escalated = (Severity.SEV2, RecoveryAction.RESTART)
    failure = FailureDetected.of(FailureCategory.CONNECTION_RESET, graded=escalated, **seen)
    assert (failure.category, failure.severity, failure.action) == (
        FailureCategory.CONNECTION_RESET,
        *escalated,
    )


def test_an_unknown_category_is_recovered_from_as_the_jobs_own_code() -> None:
    raw = WorkerException(**IDS, pid=1, exc_type="GpuMelted", message="it melted",
                          category="software_other").model_dump(mode="json")  # fmt: skip
    raw["category"] = "gpu_melted"  # a category another release of the worker knows
    report = WORKER_REPORT.validate_json(json.dumps(raw))
    assert isinstance(report, WorkerException)
    assert report.category == FailureCategory.SOFTWARE_OTHER
    assert report.message.startswith("it melted") and "'gpu_melted'" in report.message
    assert WORKER_REPORT.validate_json(report.model_dump_json()) == report  # stable re-sent
    assert from_exception(report).category == FailureCategory.SOFTWARE_OTHER


def test_a_known_category_is_left_as_it_came() -> None:
    report = WorkerException(**IDS, pid=1, exc_type="RuntimeError", message="ECC error",
                             category="ecc")  # fmt: skip
    assert (report.category, report.message) == (FailureCategory.ECC, "ECC error")
    assert from_exception(report).category == FailureCategory.ECC
