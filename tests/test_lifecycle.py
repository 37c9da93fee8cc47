"""The lifecycle tables (shared/contracts/lifecycle.py) of jobs, nodes and workers, as each
record's ``set_state`` enforces them: each move by its owner only, a job's terminal states final,
a refusal logged with the record's ids and the record kept; and no module of the package writes a
state any other way."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from unicron.shared.contracts.lifecycle import JOB_MOVES, NODE_MOVES, WORKER_MOVES, JobState, Rule
from unicron.shared.contracts.models import (
    HistoryEntry,
    Job,
    JobSpec,
    NodeRecord,
    NodeState,
    WorkerRecord,
    WorkerState,
)
from unicron.shared.contracts.roles import ServiceRole

from tests.statewrites import PACKAGE, state_writes

P, S, R, V = JobState.PENDING, JobState.STARTING, JobState.RUNNING, JobState.RECOVERING
API, DETECTOR, EXECUTOR = ServiceRole.API, ServiceRole.DETECTOR, ServiceRole.EXECUTOR
AGENT = ServiceRole.AGENT
N, W = NodeState, WorkerState
ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"


def moves_of(rules: Sequence[Rule[Any]]) -> list[tuple[Any, Any, ServiceRole]]:
    """Every (old, new, owner) the rules allow, in a stable order."""
    moves = {(old, rule.target, rule.owner) for rule in rules for old in rule.sources}
    return sorted(moves, key=lambda m: (m[0].value, m[1].value, m[2].value))


MOVES = moves_of(JOB_MOVES)


def job_in(state: JobState) -> Job:
    return Job(
        id="job-7",
        name="lm",
        spec=JobSpec(name="lm"),
        state=state,
        history=[HistoryEntry(at=1.0, state=state, reason="so far")],
    )


def refusals(logs: Sequence[Mapping[str, object]]) -> list[Mapping[str, object]]:
    return [e for e in logs if e["event"] == "job state transition refused"]


@pytest.mark.parametrize(("old", "new", "owner"), MOVES, ids=lambda v: getattr(v, "value", v))
def test_every_move_of_the_table_is_made_by_its_owner(
    old: JobState, new: JobState, owner: ServiceRole
) -> None:
    job = job_in(old)
    with capture_logs() as logs:
        moved = job.set_state(new, "why", by=owner)
    assert refusals(logs) == []
    assert job.state == new
    if old == new:  # a re-entry (a new failure during a recovery): no second history entry
        assert not moved and len(job.history) == 1
    else:
        assert moved and (job.history[-1].state, job.history[-1].reason) == (new, "why")


@pytest.mark.parametrize(
    ("old", "new", "by", "why"),
    [
        (P, R, EXECUTOR, "no transition"),  # never placed
        (R, S, EXECUTOR, "no transition"),  # no way back to starting
        (P, V, DETECTOR, "no transition"),  # nothing runs to fail
        (R, R, EXECUTOR, "no transition"),  # not a transition
        (R, JobState.CANCELLED, EXECUTOR, "not executor"),  # only a user cancels, by the API
        (R, JobState.SUCCEEDED, DETECTOR, "not detector"),  # only the executor sees the end
        (R, V, API, "not api"),
        (P, S, ServiceRole.PLANNER, "not planner"),  # the planner plans; the executor acts
        (V, R, AGENT, "not agent"),
    ],
)
def test_a_job_move_not_in_the_table_or_not_its_owner_s_is_refused_logged_and_leaves_the_record(
    old: JobState, new: JobState, by: ServiceRole, why: str
) -> None:
    job = job_in(old)
    before = job.model_copy(deep=True)
    with capture_logs() as logs:
        assert not job.set_state(new, "why", by=by)
    assert job == before
    [refused] = refusals(logs)
    logged = [refused[k] for k in ("log_level", "job_id", "old", "new", "by")]
    assert logged == ["error", "job-7", old.value, new.value, by.value]
    assert why in str(refused["why"])


@pytest.mark.parametrize("final", [s for s in JobState if s.terminal])
def test_a_finished_job_stays_finished_whoever_asks(final: JobState) -> None:
    for new in JobState:
        for by in ServiceRole:
            job = job_in(final)
            with capture_logs() as logs:
                assert not job.set_state(new, "again", by=by)
            assert job.state == final and len(job.history) == 1
            assert len(refusals(logs)) == 1


def test_a_job_lives_through_preemption_and_recovery_as_the_services_drive_it() -> None:
    job = job_in(P)
    steps = [
        (S, EXECUTOR), (R, EXECUTOR), (V, DETECTOR), (V, EXECUTOR), (R, EXECUTOR),
        (P, EXECUTOR), (S, EXECUTOR), (R, EXECUTOR), (JobState.SUCCEEDED, EXECUTOR),
    ]  # fmt: skip
    with capture_logs() as logs:
        for state, by in steps:
            job.set_state(state, f"to {state.value}", by=by)
    assert refusals(logs) == []
    assert [h.state for h in job.history] == [P, S, R, V, R, P, S, R, JobState.SUCCEEDED]


def test_replay_restores_a_move_whose_start_was_never_announced() -> None:
    job = job_in(P)  # the PENDING → STARTING announcement was lost in a crash
    assert job.replay_state(S, R, "generation 1 stepping", at=5.0)
    assert job.state == R and (job.history[-1].at, job.history[-1].reason) == (
        5.0,
        "generation 1 stepping",
    )


def test_replay_refuses_an_announcement_of_a_move_the_table_lacks() -> None:
    job = job_in(R)
    with capture_logs() as logs:
        assert not job.replay_state(R, S, "bogus", at=5.0)
    assert job.state == R and len(job.history) == 1
    assert [e["by"] for e in refusals(logs)] == ["replay"]


def test_replay_never_resurrects_a_finished_job() -> None:
    job = job_in(JobState.CANCELLED)
    with capture_logs():
        assert not job.replay_state(P, S, "late", at=5.0)
    assert job.state == JobState.CANCELLED


TABLES: Mapping[str, tuple[type[Enum], Sequence[Rule[Any]]]] = {
    "job": (JobState, JOB_MOVES),
    "node": (NodeState, NODE_MOVES),
    "worker": (WorkerState, WORKER_MOVES),
}


@pytest.mark.parametrize("record", TABLES)
def test_the_design_document_shows_each_table_as_it_is(record: str) -> None:
    states, rules = TABLES[record]
    section = DESIGN.read_text().split("## 9.")[1].split("\n## ")[0]
    row = re.compile(rf"^\| {record} \| ([A-Z, ]+) → ([A-Z]+): (.+?) \| (\w+) \(", re.M)
    documented = [
        (tuple(states(s) for s in sources.split(", ")), states(target), why, ServiceRole(by))
        for sources, target, why, by in row.findall(section)
    ]
    assert documented == [(r.sources, r.target, r.why, r.owner) for r in rules]


# --- nodes and workers ---------------------------------------------------------------------

Record = NodeRecord | WorkerRecord
IDS = {"node_id": "node-3", "job_id": "job-7", "rank": 2}


def node_in(state: NodeState) -> NodeRecord:
    return NodeRecord(id="node-3", state=state, slots=8)


def worker_in(state: WorkerState) -> WorkerRecord:
    return WorkerRecord(rank=2, node_id="node-3", state=state)


def ask(record: Record, new: Any, by: ServiceRole) -> tuple[bool, list[Mapping[str, object]]]:
    """Ask ``by`` to move ``record`` to ``new``: whether it moved, and the refusals logged."""
    with capture_logs() as logs:
        if isinstance(record, WorkerRecord):
            moved = record.set_state(new, "why", by=by, job_id="job-7")
        else:
            moved = record.set_state(new, "why", by=by)
    return moved, [e for e in logs if str(e["event"]).endswith("state transition refused")]


RECORDS: Mapping[str, Callable[[Any], Record]] = {"node": node_in, "worker": worker_in}
OTHER_MOVES = [
    (record, old, new, owner)
    for record in RECORDS
    for old, new, owner in moves_of(TABLES[record][1])
]


@pytest.mark.parametrize(
    ("record", "old", "new", "owner"), OTHER_MOVES, ids=lambda v: getattr(v, "value", v)
)
def test_every_node_and_worker_move_is_made_by_its_owner(
    record: str, old: Enum, new: Enum, owner: ServiceRole
) -> None:
    subject = RECORDS[record](old)
    moved, refused = ask(subject, new, owner)
    assert refused == [] and subject.state == new and moved == (old != new)


def test_the_re_entries_are_a_recovery_s_new_failure_races_and_repeated_exits() -> None:
    again = [("job", *m) for m in MOVES] + OTHER_MOVES
    assert {(record, old, by) for record, old, new, by in again if old == new} == {
        ("job", V, DETECTOR), ("job", V, EXECUTOR),  # a new failure during a recovery
        ("node", N.READY, DETECTOR), ("node", N.LOST, DETECTOR),  # the release's race
        ("node", N.READY, AGENT),  # a new boot of a node still READY
        *(("worker", ended, EXECUTOR) for ended in (W.SUCCEEDED, W.FAILED, W.STOPPED)),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("subject", "new", "by", "why"),
    [
        (node_in(N.READY), N.DRAINED, DETECTOR, "no transition"),  # an operator's, by hand
        (node_in(N.DRAINED), N.QUARANTINED, DETECTOR, "no transition"),
        (node_in(N.QUARANTINED), N.QUARANTINED, EXECUTOR, "no transition"),
        (worker_in(W.RUNNING), W.LAUNCHING, EXECUTOR, "no transition"),
        (worker_in(W.FAILED), W.RUNNING, EXECUTOR, "no transition"),
        (worker_in(W.RUNNING), W.RUNNING, EXECUTOR, "no transition"),
        (node_in(N.READY), N.LOST, AGENT, "not agent"),  # only the detector hears silence
        (node_in(N.LOST), N.LOST, AGENT, "not agent"),
        (node_in(N.QUARANTINED), N.READY, EXECUTOR, "not executor"),
        (node_in(N.READY), N.QUARANTINED, ServiceRole.PLANNER, "not planner"),
        (worker_in(W.RUNNING), W.FAILED, DETECTOR, "not detector"),  # it hears of failures
        (worker_in(W.LAUNCHING), W.RUNNING, AGENT, "not agent"),  # it relays the reports
    ],
    ids=str,
)
def test_a_node_or_worker_move_not_in_its_table_or_not_its_owner_s_is_refused_and_logged(
    subject: Record, new: Enum, by: ServiceRole, why: str
) -> None:
    before = subject.model_copy(deep=True)
    moved, [refused] = ask(subject, new, by)
    assert not moved and subject == before
    ids = ("node_id",) if isinstance(subject, NodeRecord) else tuple(IDS)
    assert {k: refused[k] for k in ids} == {k: IDS[k] for k in ids}
    logged = [refused[k] for k in ("log_level", "old", "new", "by")]
    assert logged == ["error", before.state.value, new.value, by.value]
    assert why in str(refused["why"])


def test_each_row_has_one_owner_and_each_table_its_services() -> None:
    assert all(isinstance(r.owner, ServiceRole) for _, rules in TABLES.values() for r in rules)
    owners = {record: {rule.owner for rule in rules} for record, (_, rules) in TABLES.items()}
    assert owners == {
        "job": {API, DETECTOR, EXECUTOR},
        "node": {DETECTOR, EXECUTOR, AGENT},
        "worker": {EXECUTOR},  # from the workers' reports, which the agents only relay
    }
    for states, rules in TABLES.values():
        assert all(isinstance(s, states) for r in rules for s in (*r.sources, r.target))


# --- no state written any other way --------------------------------------------------------


def test_the_scan_finds_each_way_of_writing_a_state_and_spares_a_service_s_own() -> None:
    source = """
class Monitor:
    def __init__(self, state):
        self.state = state
    def mark(self, node, job, worker):
        node.state = NodeState.LOST
        job.step, job.state = 3, JobState.RUNNING
        worker.state: WorkerState = WorkerState.FAILED
        setattr(node, "state", NodeState.READY)
        job.model_copy(update={"state": JobState.FAILED})
        return node.model_copy(update=dict(state=1))
class NodeRecord:
    def set_state(self, state):
        self.state = state
    def quietly(self, state):
        self.state = state
"""
    found = state_writes(source)
    assert [line.split(":")[0] for line in found] == ["6", "7", "8", "9", "10", "11", "16"]


def test_no_module_writes_a_job_node_or_worker_state_but_through_set_state() -> None:
    files = sorted(f for folder in PACKAGE for f in (ROOT / folder).rglob("*.py"))
    assert len(files) > 100  # the layout the scan expects
    found = [f"{f.relative_to(ROOT)}:{line}" for f in files for line in state_writes(f.read_text())]
    assert found == []
