"""The fairness policies and quotas as the planner service applies them: bad quotas stop it at
start-up, a running planner plans under its policy, and the plan benchmark's quota case holds."""

from __future__ import annotations

import subprocess
import sys

from unicron.planning.planning import plan_cluster
from unicron.services.planner.settings import PlannerSettings
from unicron.shared.contracts.models import Job, JobSpec
from unicron.shared.contracts.plans import Fairness

from bench.plan import cluster, quarter, running, tenants
from tests.planner.conftest import REPO
from tests.planner.live import Live


def test_the_service_refuses_to_start_on_bad_quotas() -> None:
    env = {"UNICRON_TENANT_QUOTAS": '{"team-a": -1}', "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-m", "unicron.services.planner"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "planner: bad settings" in done.stderr and "quota must be ≥ 0" in done.stderr
    assert "Traceback" not in done.stderr


async def test_the_service_plans_under_the_quotas_and_its_fairness_policy(live: Live) -> None:
    """Four slots; team-a may hold two. Every job gets its minimum, team-b the slot left."""
    for job_id, team in (("job-1", "team-a"), ("job-2", "team-a"), ("job-3", "team-b")):
        spec = JobSpec(name=job_id, min_workers=1, max_workers=2, global_batch=64)
        await live.state.create_job(Job(id=job_id, name=job_id, spec=spec, tenant=team))
    live.start_planner(tenant_quotas='{"team-a": 2}', planner_fairness="guaranteed_min")
    plan = await live.next_plan()
    assert plan.fairness == Fairness.GUARANTEED_MIN
    workers = {a.job_id: a.workers for a in plan.allocations}
    assert workers == {"job-1": 1, "job-2": 1, "job-3": 2}


def test_the_plan_benchmark_quota_case_keeps_every_tenant_to_its_quarter() -> None:
    settings = PlannerSettings(planner_cluster="a100")
    inputs = tenants(running(cluster(1024, 32, seed=1), settings))
    draft = plan_cluster(inputs, settings.objective(), quarter(1024))
    held: dict[str | None, int] = {}
    for view, a in zip(inputs.jobs, draft.allocations, strict=True):
        held[view.tenant] = held.get(view.tenant, 0) + a.workers
    assert len(held) == 4 and max(held.values()) <= 256
    assert sum(held.values()) > 3 * 256  # the quotas bind, yet the cluster stays busy
