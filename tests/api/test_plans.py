"""Plans over REST: the latest plan, a plan by id, and a 404 that says what is missing."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi import Depends, FastAPI
from unicron.planning.planning import plan_cluster, snapshot
from unicron.services.api.access import authenticate
from unicron.services.api.app import create_app
from unicron.services.api.routes import plans
from unicron.services.api.settings import ApiSettings
from unicron.services.planner.settings import PlannerSettings
from unicron.shared.contracts.models import Job, JobSpec, NodeRecord, PlanAction, now
from unicron.shared.contracts.plans import JobAllocation, Plan
from unicron.shared.store.state import StateStore

from tests.api import live
from tests.api.factories import ADMIN, TOKENS, USER_A, bearer, says_not_found


@pytest.fixture(autouse=True)
def plans_router(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Serve the plans router even before ``services/api/app.py`` registers it."""

    def create(settings: ApiSettings | None = None) -> FastAPI:
        app = create_app(settings)
        if not any(getattr(r, "path", "").startswith("/v1/plans") for r in app.routes):
            app.include_router(plans.router, dependencies=[Depends(authenticate)])
        return app

    monkeypatch.setattr(live, "create_app", create)
    yield


async def planned(state: StateStore) -> Plan:
    """A real plan: one job started on a two-slot node, explained."""
    nodes = [NodeRecord(id="node-a", slots=2)]
    jobs = [Job(id="job-1", name="job-1", spec=JobSpec(name="job-1", max_workers=2))]
    draft = plan_cluster(snapshot(nodes, jobs, now()), PlannerSettings().objective())
    plan = Plan(seq=1, epoch=1, trigger="job.submitted job-1", allocations=draft.allocations)
    await state.save_plan(plan)
    return plan


async def test_no_plan_yet_is_a_404_that_says_so(client: httpx.AsyncClient) -> None:
    assert await says_not_found(client, "/v1/plans/latest", "no plan yet")


async def test_latest_and_by_id_return_the_explained_plan(
    client: httpx.AsyncClient, state: StateStore
) -> None:
    plan = await planned(state)
    latest = await client.get("/v1/plans/latest")
    assert latest.status_code == 200
    assert Plan.model_validate(latest.json()) == plan
    [allocation] = latest.json()["allocations"]
    assert allocation["config"]["dp"] == 2
    assert allocation["explanation"]["transition"] == "start"
    assert allocation["explanation"]["alternatives"][0]["workers"] == 1
    by_id = await client.get(f"/v1/plans/{plan.id}")
    assert Plan.model_validate(by_id.json()) == plan
    missing = await client.get("/v1/plans/plan-nope")
    assert missing.status_code == 404
    assert "plan-nope" in missing.json()["detail"]


async def test_a_user_sees_only_its_tenants_jobs_in_a_plan(
    nats_url: str, redis_url: str, state: StateStore
) -> None:
    for job_id, tenant in (("job-a", "team-a"), ("job-b", "team-b")):
        job = Job(id=job_id, name=job_id, spec=JobSpec(name=job_id), tenant=tenant)
        await state.create_job(job)
    allocations = [
        JobAllocation(job_id=job_id, workers=1, action=PlanAction.START)
        for job_id in ("job-a", "job-b")
    ]
    await state.save_plan(Plan(seq=1, allocations=allocations, expected_waf=2.0))
    with live.serve_api(nats_url, redis_url, api_tokens=TOKENS) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as http:
            assert (await http.get("/v1/plans/latest")).status_code == 401
            user = (await http.get("/v1/plans/latest", headers=bearer(USER_A))).json()
            admin = (await http.get("/v1/plans/latest", headers=bearer(ADMIN))).json()
    assert [a["job_id"] for a in user["allocations"]] == ["job-a"]
    assert [a["job_id"] for a in admin["allocations"]] == ["job-a", "job-b"]
