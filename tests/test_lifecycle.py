"""The job lifecycle table (shared/contracts/lifecycle.py), as ``Job.set_state`` enforces it: each
move by its owner only, terminal states final, a refusal logged with the job and the record kept."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from unicron.shared.contracts.lifecycle import TRANSITIONS, JobState
from unicron.shared.contracts.models import HistoryEntry, Job, JobSpec
from unicron.shared.contracts.roles import ServiceRole

P, S, R, V = JobState.PENDING, JobState.STARTING, JobState.RUNNING, JobState.RECOVERING
API, DETECTOR, EXECUTOR = ServiceRole.API, ServiceRole.DETECTOR, ServiceRole.EXECUTOR
DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
MOVES = sorted(
    {(old, rule.target, rule.owner) for rule in TRANSITIONS for old in rule.sources},
    key=lambda m: (m[0].value, m[1].value, m[2].value),
)


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


def refused_move(old: JobState, new: JobState, by: ServiceRole) -> Mapping[str, object]:
    """Ask ``by`` to move a job from ``old`` to ``new``: refused, the record untouched, and the
    one refusal logged is returned."""
    job = job_in(old)
    before = job.model_copy(deep=True)
    with capture_logs() as logs:
        assert not job.set_state(new, "why", by=by)
    assert job == before
    [refused] = refusals(logs)
    return refused


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


def test_the_only_re_entry_is_a_recovery_that_meets_another_failure() -> None:
    assert {(old, owner) for old, new, owner in MOVES if old == new} == {
        (V, DETECTOR),
        (V, EXECUTOR),
    }


@pytest.mark.parametrize(
    ("old", "new", "by"),
    [
        (P, R, EXECUTOR),  # never placed
        (R, S, EXECUTOR),  # no way back to starting
        (P, V, DETECTOR),  # nothing runs to fail
        (R, R, EXECUTOR),  # not a transition
    ],
)
def test_a_move_not_in_the_table_is_refused_logged_and_leaves_the_record(
    old: JobState, new: JobState, by: ServiceRole
) -> None:
    refused = refused_move(old, new, by)
    assert refused["log_level"] == "error"
    assert (refused["job_id"], refused["old"], refused["new"], refused["by"]) == (
        "job-7",
        old.value,
        new.value,
        by.value,
    )


@pytest.mark.parametrize(
    ("old", "new", "by"),
    [
        (R, JobState.CANCELLED, EXECUTOR),  # only a user cancels, through the API
        (R, JobState.SUCCEEDED, DETECTOR),  # only the executor sees every worker finish
        (R, V, API),
        (P, S, ServiceRole.PLANNER),  # the planner plans; the executor carries it out
        (V, R, ServiceRole.AGENT),
    ],
)
def test_a_move_by_a_service_that_does_not_own_it_is_refused(
    old: JobState, new: JobState, by: ServiceRole
) -> None:
    refused = refused_move(old, new, by)
    assert refused["by"] == by.value and "not " + by.value in str(refused["why"])


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


def test_the_design_document_shows_the_table_as_it_is() -> None:
    section = DESIGN.read_text().split("## 9.")[1].split("\n## ")[0]
    row = re.compile(r"^\| job \| ([A-Z, ]+) → ([A-Z]+): (.+?) \| (\w+) \(", re.M)
    documented = [
        (tuple(JobState(s) for s in sources.split(", ")), JobState(target), why, ServiceRole(by))
        for sources, target, why, by in row.findall(section)
    ]
    assert documented == [(r.sources, r.target, r.why, r.owner) for r in TRANSITIONS]
