"""The fairness policies and quotas as a user of the planner meets them: from job records to a
plan that says who waits, why and since when."""

from __future__ import annotations

import pytest
from unicron.planning.fairness import PlanRules, TenantQuotas, waited_s, waiting_since
from unicron.planning.planning import PlanDraft, plan_cluster, snapshot
from unicron.shared.contracts.models import HistoryEntry, Job, JobState, NodeRecord, NodeState
from unicron.shared.contracts.plans import Fairness, WaitReason

from tests.planning.test_planning import NOW, OBJECTIVE, by_job, job, node

HOUR = 3600.0


def waited(j: Job, hours: float) -> Job:
    """``j`` submitted ``hours`` ago and PENDING ever since."""
    at = NOW - hours * HOUR
    history = [HistoryEntry(at=at, state=JobState.PENDING, reason="submitted")]
    return j.model_copy(update={"submitted_at": at, "history": history})


def tenant(j: Job, name: str) -> Job:
    return j.model_copy(update={"tenant": name})


def plan(nodes: list[NodeRecord], jobs: list[Job], rules: PlanRules) -> PlanDraft:
    return plan_cluster(snapshot(nodes, jobs, NOW, rules=rules), OBJECTIVE, rules)


def test_waiting_time_is_read_from_the_history() -> None:
    j = job("job-1").model_copy(update={"submitted_at": 0.0, "history": [
        HistoryEntry(at=0.0, state=JobState.PENDING, reason="submitted"),
        HistoryEntry(at=10.0, state=JobState.STARTING, reason="placed"),
        HistoryEntry(at=12.0, state=JobState.RUNNING, reason="stepping"),
        HistoryEntry(at=100.0, state=JobState.PENDING, reason="preempted"),
    ]})  # fmt: skip
    assert waiting_since(j) == 100.0
    assert waited_s(j, 150.0) == 60.0  # 10 s before its first start, 50 s since preempted
    assert waited_s(j, 50.0) == 10.0
    running = j.model_copy(update={"state": JobState.RUNNING})
    assert waiting_since(running) is None


def test_aging_starts_a_starved_job_once_it_has_waited_long_enough() -> None:
    nodes = [node("node-a", 4)]
    heavy = job("job-1", lo=4, hi=4, weight=2.0, state=JobState.RUNNING, ranks=("node-a",) * 4)
    rules = PlanRules(Fairness.AGING, aging_s=24 * HOUR, aging_step_s=HOUR)
    starved = by_job(plan(nodes, [heavy, waited(job("job-2", 4, 4), 20)], rules))
    assert starved["job-1"].workers == 4 and starved["job-2"].workers == 0
    assert starved["job-2"].explanation is not None
    counted = 20 * HOUR - (NOW - rules.boundary(NOW))  # up to the last whole step
    assert starved["job-2"].explanation.weight_factor == pytest.approx(1 + counted / (24 * HOUR))
    assert starved["job-2"].waiting_reason == WaitReason.LOWER_VALUE
    # past 24 h its weight has more than doubled: it beats the weight-2 job
    aged = by_job(plan(nodes, [heavy, waited(job("job-2", 4, 4), 30)], rules))
    assert aged["job-2"].workers == 4 and aged["job-1"].workers == 0
    assert "preempted" in aged["job-1"].reason and "waits: lower value" in aged["job-1"].reason
    # the same records under pure WAF: it waits on
    waf = by_job(plan(nodes, [heavy, waited(job("job-2", 4, 4), 30)], PlanRules()))
    assert waf["job-2"].workers == 0


def test_waiting_is_counted_in_whole_aging_steps() -> None:
    rules = PlanRules(Fairness.AGING, aging_s=24 * HOUR, aging_step_s=HOUR)
    j = waited(job("job-1"), 2.5)
    boundary = rules.boundary(NOW)
    assert rules.counted_wait(j, NOW) == pytest.approx(waited_s(j, boundary))
    assert rules.counted_wait(j, NOW + 60) == rules.counted_wait(j, NOW)  # same step: no re-plan
    assert PlanRules().counted_wait(j, NOW) == 0.0  # pure WAF counts none


def test_a_waiting_job_says_why_and_since_when() -> None:
    nodes = [node("node-a", 4)]
    runner = job("job-1", lo=2, hi=4, weight=3.0, state=JobState.RUNNING, ranks=("node-a",) * 4)
    cheap = waited(job("job-2", lo=2, hi=2, weight=0.5), 5)
    got = by_job(plan(nodes, [runner, cheap], PlanRules()))["job-2"]
    assert got.action.value == "wait" and got.waiting_reason == WaitReason.LOWER_VALUE
    assert got.waiting_since == pytest.approx(NOW - 5 * HOUR)
    # the marginal comparison: what it would add against what the slots earn in job-1
    assert "lower value than the jobs that run: on 2 workers it would add" in got.reason
    assert "earn" in got.reason and "in job-1 (4→2 workers)" in got.reason
    assert "the best plan that starts it is short by" in got.reason
    # a user reads the reason: another tenant's job is not named to it
    jobs = [tenant(runner, "team-a"), tenant(cheap, "team-b")]
    got = by_job(plan(nodes, jobs, PlanRules()))["job-2"]
    assert "in (another tenant's job) (4→2 workers)" in got.reason and "job-1" not in got.reason


def test_over_its_tenant_quota() -> None:
    nodes = [node("node-a", 4)]
    first, second = waited(job("job-1", 2, 2), 2), waited(job("job-2", 2, 2), 1)
    jobs = [tenant(first, "team-a"), tenant(second, "team-a")]
    rules = PlanRules(quotas=TenantQuotas.parse({"team-a": 2}))
    draft = plan(nodes, jobs, rules)
    got = by_job(draft)
    assert got["job-1"].workers == 2 and draft.free_slots == 2  # free, but not team-a's
    assert got["job-2"].waiting_reason == WaitReason.TENANT_QUOTA
    assert got["job-2"].reason == (
        "over its tenant's quota: tenant team-a's jobs hold 2 of its 2 slots, it needs 2 workers"
    )
    # "*" covers every other tenant; a job with no tenant has no quota
    others = PlanRules(quotas=TenantQuotas.parse({"*": 0}))
    got = by_job(plan(nodes, [tenant(job("job-1"), "team-b"), job("job-2")], others))
    assert got["job-1"].waiting_reason == WaitReason.TENANT_QUOTA and got["job-2"].workers == 2


def test_below_its_minimum_after_the_guaranteed_minimums() -> None:
    nodes = [node("node-a", 4)]
    jobs = [job("job-1", 2, 4, weight=0.5), job("job-2", 2, 2), job("job-3", 3, 3, weight=9.0)]
    got = by_job(plan(nodes, jobs, PlanRules(Fairness.GUARANTEED_MIN)))
    assert (got["job-1"].workers, got["job-2"].workers, got["job-3"].workers) == (2, 2, 0)
    assert got["job-3"].waiting_reason == WaitReason.BELOW_MINIMUM
    assert got["job-3"].reason == (
        "below its minimum with the slots left: 0 slots free and the guaranteed minimums of "
        "earlier jobs hold 4; it needs 3 workers"
    )
    assert got["job-1"].explanation and got["job-1"].explanation.guaranteed_workers == 2


def test_too_big_for_the_cluster_or_for_the_nodes_left() -> None:
    got = by_job(plan([node("node-a", 2)], [job("job-1", 3, 3)], PlanRules()))["job-1"]
    assert got.waiting_reason == WaitReason.CLUSTER_TOO_SMALL
    assert got.reason == "needs 3 workers, the cluster has 2 slots"
    quarantined = node("node-b").model_copy(update={"state": NodeState.QUARANTINED})
    got = by_job(plan([node("node-a"), quarantined], [job("job-1", 3, 3)], PlanRules()))["job-1"]
    assert got.waiting_reason == WaitReason.NODES_UNAVAILABLE
    assert "out of service: node-b QUARANTINED (2 slots)" in got.reason
