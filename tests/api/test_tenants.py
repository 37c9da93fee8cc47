"""Tenant policy: a user's weight is bounded, and no response names another tenant's job."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import PlanCreated, PlannedJob
from unicron.shared.contracts.models import NodeRecord, NodeWorker, PlanAction
from unicron.shared.contracts.plans import JobAllocation, Plan
from unicron.shared.store.state import StateStore

from tests.api.factories import ADMIN, TOKENS, USER_A, USER_B, bearer
from tests.api.live import serve_api


@pytest.fixture
def secured_url(nats_url: str, redis_url: str) -> Iterator[str]:
    with serve_api(nats_url, redis_url, api_tokens=TOKENS, api_user_max_weight=10) as url:
        yield url


@pytest.fixture
async def http(secured_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=secured_url, timeout=10.0) as client:
        yield client


async def submit(http: httpx.AsyncClient, token: str, weight: float = 1.0) -> httpx.Response:
    return await http.post("/v1/jobs", json={"name": "w", "weight": weight}, headers=bearer(token))


async def test_a_users_weight_is_bounded_and_an_admins_only_by_the_spec(
    http: httpx.AsyncClient,
) -> None:
    refused = await submit(http, USER_A, weight=11)
    assert refused.status_code == 403
    assert "above 10" in refused.json()["detail"]
    assert "UNICRON_API_USER_MAX_WEIGHT" in refused.json()["detail"]
    assert (await submit(http, USER_A, weight=10)).status_code == 201
    assert (await submit(http, ADMIN, weight=5000)).status_code == 201
    assert (await submit(http, ADMIN, weight=2e6)).status_code == 422  # the spec's own bound
    jobs = (await http.get("/v1/jobs", headers=bearer(ADMIN))).json()
    assert sorted(j["spec"]["weight"] for j in jobs) == [10, 5000]


def allocation(job_id: str) -> JobAllocation:
    return JobAllocation(job_id=job_id, workers=1, nodes=["node-a"], action=PlanAction.START)


async def test_plans_and_events_name_no_other_tenants_job(
    http: httpx.AsyncClient, state: StateStore, bus: Bus
) -> None:
    job_a = (await submit(http, USER_A)).json()["id"]
    job_b = (await submit(http, USER_B)).json()["id"]
    trigger = f"job.submitted {job_a}, job.submitted {job_b}, reconcile: job job-gone1 new"
    plan = Plan(trigger=trigger, allocations=[allocation(job_a), allocation(job_b)])
    await state.save_plan(plan)
    planned = [PlannedJob(job_id=j, action=PlanAction.START, workers=1, previous_workers=0)
               for j in (job_a, job_b)]  # fmt: skip
    await bus.publish_event(
        PlanCreated(plan_id=plan.id, seq=1, epoch=1, trigger=trigger, expected_waf=1.0,
                    jobs=planned)
    )  # fmt: skip

    for path in ("/v1/plans/latest", f"/v1/plans/{plan.id}"):
        seen = await http.get(path, headers=bearer(USER_B))
        assert seen.status_code == 200, seen.text
        assert job_a not in seen.text and "job-gone1" not in seen.text, path
        assert [a["job_id"] for a in seen.json()["allocations"]] == [job_b]
        assert seen.json()["trigger"] == (
            f"job.submitted (another tenant's job), job.submitted {job_b}, "
            "reconcile: job (another tenant's job) new"
        )
    admin_view = (await http.get("/v1/plans/latest", headers=bearer(ADMIN))).json()
    assert admin_view["trigger"] == trigger

    async with asyncio.timeout(10):
        events = await http.get("/v1/events", params={"follow": "false"}, headers=bearer(USER_B))
    assert job_b in events.text and job_a not in events.text
    assert "plan.created" not in events.text


async def test_an_unreadable_job_record_hides_no_other(
    http: httpx.AsyncClient, state: StateStore
) -> None:
    good = (await submit(http, ADMIN)).json()["id"]
    await state.redis.set(state._key("job", "job-garbage"), '{"id": "job-garbage", "spec": 7')
    await state.redis.zadd(state._key("jobs"), {"job-garbage": 0.0})
    for _ in range(2):  # and again: skipping is not a one-off
        listed = await http.get("/v1/jobs", headers=bearer(ADMIN))
        assert listed.status_code == 200, listed.text
        assert [j["id"] for j in listed.json()] == [good]


async def test_nodes_list_only_the_callers_own_workers(
    http: httpx.AsyncClient, state: StateStore
) -> None:
    job_a = (await submit(http, USER_A)).json()["id"]
    job_b = (await submit(http, USER_B)).json()["id"]
    workers = [NodeWorker(job_id=j, generation=1, rank=0, pid=9) for j in (job_a, job_b)]
    await state.put_node(NodeRecord(id="node-a", slots=2, workers=workers))

    async def seen(token: str) -> list[str]:
        nodes = (await http.get("/v1/nodes", headers=bearer(token))).json()
        return [w["job_id"] for w in nodes[0]["workers"]]

    assert await seen(USER_A) == [job_a]
    assert await seen(USER_B) == [job_b]
    assert await seen(ADMIN) == [job_a, job_b]
