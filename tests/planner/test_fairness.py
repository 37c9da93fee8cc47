"""The fairness policies and quotas as a user of the planner meets them: from job records to a
plan that says who waits, why and since when; and the settings refused at start-up."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from pydantic import ValidationError

from tests.planner.conftest import REPO
from tests.planner.live import StartPlanner, next_plan
from tests.planner.test_planning import NOW, OBJECTIVE, by_job, job, node
from unicron.services.planner.fairness import PlanRules, TenantQuotas, waited_s, waiting_since
from unicron.services.planner.planning import PlanDraft, plan_cluster, snapshot
from unicron.services.planner.settings import PlannerSettings
from unicron.shared.events import PlanCreated
from unicron.shared.models import HistoryEntry, Job, JobSpec, JobState, NodeRecord, NodeState
from unicron.shared.plans import Fairness, WaitReason
from unicron.shared.state import StateStore

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


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"tenant_quotas": "{team-a: 8"}, "UNICRON_TENANT_QUOTAS is not valid JSON"),
        ({"tenant_quotas": '{"team-a": -8}'}, "'team-a': quota must be ≥ 0 slots, not -8"),
        ({"tenant_quotas": '{"team-a": 8.5}'}, "quota must be a whole number of slots"),
        ({"tenant_quotas": '["team-a"]'}, "must be a JSON object"),
        ({"tenant_quotas": '{"a b": 8}'}, "'a b' is not a tenant name"),
        ({"tenant_quotas": '{"team-a": 12}', "planner_cluster": "a100"},
         "12 slots is not a multiple of the 8 slots"),
        ({"planner_fairness": "fair"}, "'waf', 'aging' or 'guaranteed_min'"),
        ({"planner_aging_s": "0"}, "greater than 0"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused_with_a_clear_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PlannerSettings(**env)  # type: ignore[arg-type]


def test_the_service_refuses_to_start_on_bad_quotas() -> None:
    env = {"UNICRON_TENANT_QUOTAS": '{"team-a": -1}', "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-m", "unicron.services.planner"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "planner: bad settings" in done.stderr and "quota must be ≥ 0" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_settings_build_the_rules() -> None:
    settings = PlannerSettings(
        planner_fairness=Fairness.AGING,
        planner_aging_s=7200.0,
        tenant_quotas='{"team-a": 16, "*": 8}',
        planner_cluster="a100",
    )
    rules = settings.rules()
    assert rules.fairness == Fairness.AGING and rules.aging_s == 7200.0
    assert rules.quotas.of("team-a") == 16 and rules.quotas.of("team-z") == 8
    assert rules.quotas.of(None) is None


async def test_the_service_plans_under_the_quotas_and_its_fairness_policy(
    start_planner: StartPlanner,
    nodes: tuple[str, ...],
    state: StateStore,
    plans: asyncio.Queue[PlanCreated],
) -> None:
    """Four slots; team-a may hold two. Every job gets its minimum, team-b the slot left."""
    for job_id, team in (("job-1", "team-a"), ("job-2", "team-a"), ("job-3", "team-b")):
        spec = JobSpec(name=job_id, min_workers=1, max_workers=2, global_batch=64)
        await state.create_job(Job(id=job_id, name=job_id, spec=spec, tenant=team))
    start_planner(tenant_quotas='{"team-a": 2}', planner_fairness="guaranteed_min")
    plan = await next_plan(plans, state)
    assert plan.fairness == Fairness.GUARANTEED_MIN
    workers = {a.job_id: a.workers for a in plan.allocations}
    assert workers == {"job-1": 1, "job-2": 1, "job-3": 2}
