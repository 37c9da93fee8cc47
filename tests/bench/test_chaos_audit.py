"""How the chaos bench counts what a fault caused, from the event stream: one failure per
fault, a second one for the same fault is a duplicate, none is a miss, and a failure nobody
injected is a false alarm, not a duplicate."""

from __future__ import annotations

import math
from typing import Any

import pytest
from unicron.shared.contracts.messages import FaultKind

from bench.chaos_audit import audit
from bench.chaos_plan import ActionPlan, FaultPlan
from bench.chaos_records import ActionRecord, Injection

JOB = "job-0123456789ab"


def injected(order: int, at: float, generation: int, recovered_at: float | None) -> Injection:
    fault = FaultPlan(lane=0, order=order, kind=FaultKind.CRASH, rank=1, gap=30)
    body = {"rank": 1, "kind": "crash"}
    return Injection(fault, body, JOB, f"cmd-{order}", generation, "node-0", at, 100, True,
                     recovered_at)  # fmt: skip


def failure(generation: int, at: float, drill: str | None, **data: Any) -> dict[str, Any]:
    fields = {
        "job_id": JOB, "generation": generation, "rank": 1, "kind": "crash",
        "category": "exited_abnormally", "action": "restart", "observed_at": at,
        "evidence": {"drill": drill} if drill else {}, **data,
    }  # fmt: skip
    return {"id": f"failure.detected:{JOB}:{generation}:{at}", "type": "failure.detected",
            "data": fields}  # fmt: skip


def recovered(generation: int, downtime_s: float) -> dict[str, Any]:
    data = {"job_id": JOB, "generation": generation, "downtime_s": downtime_s}
    return {"id": f"transition.completed:{JOB}:{generation}", "type": "transition.completed",
            "data": data}  # fmt: skip


def test_each_fault_is_matched_to_its_failure_and_recovery_even_when_replayed() -> None:
    first, second = injected(0, 10.0, 1, 11.0), injected(1, 20.0, 2, 21.0)
    events = [failure(1, 10.1, "cmd-0"), recovered(2, 0.4), failure(2, 20.1, "cmd-1"),
              recovered(3, 0.5), recovered(3, 0.5)]  # fmt: skip
    result = audit(events + events[:1], [first, second], [])  # a replayed copy, same id
    assert (result.missed, result.duplicates, result.unexplained) == (0, 0, [])
    assert result.recoveries() == pytest.approx([0.4, 0.5])


def test_a_fault_without_a_failure_is_missed_and_a_second_failure_is_a_duplicate() -> None:
    lost, twice = injected(0, 10.0, 1, 11.0), injected(1, 20.0, 2, None)
    # the recovery from the second fault failed once more before it stepped (generation 3)
    events = [failure(2, 20.1, "cmd-1"), failure(3, 20.6, None), recovered(4, 0.3)]
    result = audit(events, [lost, twice], [])
    assert (result.missed, result.duplicates) == (1, 1)
    assert result.recoveries() == pytest.approx([0.8])  # from the first failure, through the second


def test_a_failure_after_the_job_recovered_is_unexplained_and_stragglers_are_advisory() -> None:
    fault = injected(0, 10.0, 1, 11.0)
    events = [failure(1, 10.1, "cmd-0"), recovered(2, 0.4), failure(2, 30.0, None),
              failure(2, 31.0, None, action="report", kind="straggler")]  # fmt: skip
    result = audit(events, [fault], [])
    assert (result.missed, result.duplicates, result.advisory) == (0, 0, 1)
    assert [f["observed_at"] for f in result.unexplained] == [30.0]


def test_failures_during_an_agent_kill_are_the_kills_not_a_faults() -> None:
    fault = injected(0, 10.0, 1, 11.0)
    kill = ActionRecord(ActionPlan("agent-node-0", 0, 0, 0.1, 2.0), 15.0, 17.0, 25.0)
    events = [failure(1, 10.1, "cmd-0"), failure(2, 15.2, None, kind="node_lost")]
    result = audit(events, [fault], [kill])
    assert (result.missed, result.duplicates, result.unexplained) == (0, 0, [])
    assert len(result.agent_failures) == 1


def test_a_fault_never_recovered_from_counts_as_an_infinite_recovery() -> None:
    fault = injected(0, 10.0, 1, None)
    result = audit([failure(1, 10.1, "cmd-0")], [fault], [])
    assert result.missed == 0 and result.recoveries() == [math.inf]


def test_the_loss_of_a_killed_agents_node_is_the_kills_though_seen_at_its_last_heartbeat() -> None:
    kill = ActionRecord(ActionPlan("agent-node-0", 0, 0, 0.1, 2.0), 15.0, 17.0, 25.0)
    lost = failure(2, 14.4, None, kind="node_lost", node_id="node-0")
    elsewhere = failure(2, 14.4, None, node_id="node-1")
    result = audit([lost], [], [kill])
    assert (len(result.agent_failures), result.unexplained) == (1, [])
    assert len(audit([elsewhere], [], [kill]).unexplained) == 1
