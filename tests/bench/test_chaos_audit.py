"""How the chaos bench counts what a fault caused, from the event stream: one failure per
fault, a second one for the same fault is a duplicate, none is a miss, a failure nobody
injected is a false alarm, not a duplicate, and a node declared lost whose agent the bench did
not kill is a false node loss; and how it splits and explains the recovery times."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from unicron.shared.contracts.messages import FaultKind

from bench.chaos import summary
from bench.chaos_audit import Audit, audit
from bench.chaos_plan import ActionPlan, FaultPlan, make_plan
from bench.chaos_records import ActionRecord, ChaosLog, Injection
from bench.chaos_report import ChaosResult, print_tables
from bench.chaos_slow import slow_recoveries

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


def recovered(generation: int, downtime_s: float, **data: Any) -> dict[str, Any]:
    data |= {"job_id": JOB, "generation": generation, "downtime_s": downtime_s}
    return {"id": f"transition.completed:{JOB}:{generation}", "type": "transition.completed",
            "data": data}  # fmt: skip


def node_lost(node_id: str, last_heartbeat: float, declared_at: float) -> dict[str, Any]:
    data = {"node_id": node_id, "boot_id": "boot-1", "last_heartbeat": last_heartbeat}
    return {"id": f"node.lost:{node_id}:boot-1:{last_heartbeat:.3f}", "type": "node.lost",
            "time": datetime.fromtimestamp(declared_at, UTC).isoformat(), "data": data}  # fmt: skip


def lost_failure(generation: int, node_id: str, last_heartbeat: float, declared_at: float) -> Any:
    return failure(generation, last_heartbeat, None, kind="node_lost", category="node_down",
                   node_id=node_id, detected_at=declared_at)  # fmt: skip


def killed(target: str, at: float, down_s: float = 1.0, back_s: float = 2.0) -> ActionRecord:
    return ActionRecord(ActionPlan(target, 0, 1, 0.1, down_s), at, at + down_s, at + back_s)


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


def test_a_node_lost_whose_agent_was_never_killed_is_a_false_loss_not_a_duplicate() -> None:
    fault = injected(0, 10.0, 1, None)
    redis = killed("redis-server", 10.5)
    # Redis died while the job recovered; once back, the detector found node-0 silent.
    events = [failure(1, 10.1, "cmd-0"), node_lost("node-0", 10.4, 14.0),
              lost_failure(2, "node-0", 10.4, 14.0), recovered(3, 4.0)]  # fmt: skip
    result = audit(events, [fault], [redis])
    assert (result.duplicates, result.unexplained, result.agent_failures) == (0, [], [])
    [event], [lost] = result.false_node_losses, result.false_loss_failures
    assert (event.node_id, event.failure, event.after) == ("node-0", None, redis)
    assert event.kill_lead_s == pytest.approx(3.5)
    assert lost.failure is not None and lost.failure["generation"] == 2
    assert result.outcomes[0].false_losses == [lost]
    # the job recovered only once it recovered from the loss too: 10.1 → 10.4 + 4.0
    assert result.recoveries() == pytest.approx([4.3])


def test_a_node_lost_when_its_agent_was_killed_is_not_false_but_another_node_then_is() -> None:
    agent = killed("agent-node-0", 15.0, down_s=2.0, back_s=10.0)
    events = [node_lost("node-0", 14.4, 18.0), lost_failure(2, "node-0", 14.4, 18.0),
              node_lost("node-1", 14.9, 18.1)]  # fmt: skip
    result = audit(events, [], [agent])
    assert len(result.agent_failures) == 1 and result.false_loss_failures == []
    assert [(loss.node_id, loss.after) for loss in result.false_node_losses] == [("node-1", agent)]
    # long after its agent was back, node-0's silence is no longer the kill's
    later = audit([node_lost("node-0", 100.0, 103.0)], [], [agent])
    assert [loss.node_id for loss in later.false_node_losses] == ["node-0"]


def chaos_result(result: Audit, injections: list[Injection], actions: list[ActionRecord]) -> Any:
    log = ChaosLog(injections=injections, actions=actions)
    plan = make_plan(seed=0, faults=len(injections), lanes=1, quick=True)
    return ChaosResult(plan, log, result, [], {}, {}, [], Path("/tmp/chaos"), 1.0)


def test_the_p99_of_recoveries_is_split_between_during_and_outside_kills() -> None:
    calm, hit = injected(0, 10.0, 1, 11.0), injected(1, 20.0, 2, 30.0)
    executor = killed("executor", 20.5)
    events = [failure(1, 10.1, "cmd-0"), recovered(2, 0.4), failure(2, 20.1, "cmd-1"),
              recovered(3, 9.0)]  # fmt: skip
    result = audit(events, [calm, hit], [executor])
    assert result.recoveries(overlapped=False) == pytest.approx([0.4])
    assert result.recoveries(overlapped=True) == pytest.approx([9.0])
    figures = summary(chaos_result(result, [calm, hit], [executor]))
    assert figures["recovery_p99_outside_kills_s"] == pytest.approx(0.4)
    assert figures["recovery_p99_during_kill_s"] == pytest.approx(9.0)
    assert figures["recovery_p99_s"] > 8.0
    assert (figures["false_node_losses"], figures["false_node_loss_failures"]) == (0, 0)


def test_each_slow_recovery_is_explained_by_its_phases_and_what_it_waited_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    quick, slow = injected(0, 10.0, 1, 11.0), injected(1, 20.0, 2, 30.0)
    slower = dataclasses.replace(injected(2, 40.0, 3, 50.0), warm=False)
    planner = killed("planner", 20.6)
    phases = {"detect": 0.1, "plan": 3.5, "regroup": 0.8, "state_transfer": 0.3, "first_step": 0.2}
    events = [failure(1, 10.1, "cmd-0"), recovered(2, 0.4), failure(2, 20.1, "cmd-1"),
              recovered(3, 5.0, phases=phases, kind="in_place"), failure(3, 40.1, "cmd-2"),
              recovered(4, 7.0, phases={"first_step": 6.0}, kind="checkpoint",
                        state_source="disk")]  # fmt: skip
    result = audit(events, [quick, slow, slower], [planner])
    explained = slow_recoveries(result.outcomes)
    assert [row.outcome.injection for row in explained] == [slower, slow]  # slowest first
    [no_spare, waited] = explained
    assert waited.phases == pytest.approx(phases | {"unphased": 0.4})
    assert waited.longest_phase == "plan"
    assert waited.waited_on == ["planner kill -9 at +0.5 s", "mostly the planner"]
    assert no_spare.waited_on[:2] == ["no warm spare", "checkpoint restart (state: disk)"]
    print_tables(chaos_result(result, [quick, slow, slower], [planner]))
    table = capsys.readouterr().out.split("slow (slowest first)")[1]
    assert "plan=3.50" in table and "unphased=0.40" in table and "no warm spare" in table
