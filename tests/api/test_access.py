"""Access control (docs/design.md §6): bearer tokens, admin-only calls, tenant scoping."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from unicron.services.api.__main__ import check_bind, load_settings
from unicron.services.api.access import Caller, grant_for, may_see
from unicron.services.api.app import create_app
from unicron.services.api.settings import ApiSettings
from unicron.shared.contracts.models import Job, JobSpec
from unicron.shared.store.state import StateStore

from tests.api.factories import ADMIN, TOKENS, USER_A, USER_B, bearer, put_job


def v1_calls() -> list[tuple[str, str]]:
    """(method, path) of every /v1 operation the app documents, with placeholders filled in."""
    paths = create_app(ApiSettings(api_tokens=TOKENS)).openapi()["paths"]
    return [
        (method.upper(), path.replace("{job_id}", "job-x").replace("{", "").replace("}", ""))
        for path, operations in paths.items()
        if path.startswith("/v1")
        for method in operations
    ]


async def test_every_v1_call_needs_a_valid_token_and_probes_stay_open(
    secured: httpx.AsyncClient,
) -> None:
    calls = v1_calls()
    assert ("POST", "/v1/jobs/job-x/faults") in calls and ("GET", "/v1/events") in calls
    for method, path in calls:
        for headers, error in (({}, None), (bearer("not-a-token-at-all"), "invalid_token")):
            response = await secured.request(method, path, headers=headers, json={})
            assert response.status_code == 401, (method, path, response.text)
            challenge = response.headers["WWW-Authenticate"]
            assert challenge.startswith("Bearer") and (error is None or error in challenge)
    assert "bearer token" in (await secured.get("/v1/jobs")).json()["detail"]
    for path in ("/livez", "/readyz"):
        assert (await secured.get(path)).status_code == 200, path


async def test_metrics_name_every_tenants_jobs_so_they_take_an_admin_token(
    secured: httpx.AsyncClient, state: StateStore
) -> None:
    await put_job(state, "job-secret")
    assert (await secured.get("/metrics")).status_code == 401
    refused = await secured.get("/metrics", headers=bearer(USER_A))
    assert refused.status_code == 403 and "admin" in refused.json()["detail"]
    scraped = await secured.get("/metrics", headers=bearer(ADMIN))
    assert scraped.status_code == 200 and 'job="job-secret"' in scraped.text


async def test_fault_injection_is_for_admins_only(
    secured: httpx.AsyncClient, state: StateStore
) -> None:
    await put_job(state, "job-drill")
    fault = {"rank": 0, "kind": "hang"}
    refused = await secured.post("/v1/jobs/job-drill/faults", json=fault, headers=bearer(USER_A))
    assert refused.status_code == 403
    assert "needs an admin token" in refused.json()["detail"]
    accepted = await secured.post("/v1/jobs/job-drill/faults", json=fault, headers=bearer(ADMIN))
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["node_id"] == "node-a"


async def test_a_user_sees_and_controls_only_its_tenants_jobs(secured: httpx.AsyncClient) -> None:
    key = {"Idempotency-Key": "nightly"}
    mine = await secured.post("/v1/jobs", json={"name": "a"}, headers=bearer(USER_A) | key)
    assert mine.status_code == 201 and mine.json()["tenant"] == "team-a"
    job_a = mine.json()["id"]
    # The same key from another tenant is another job, not a way to read team-a's.
    theirs = await secured.post("/v1/jobs", json={"name": "a"}, headers=bearer(USER_B) | key)
    assert theirs.status_code == 201 and theirs.json()["id"] != job_a
    job_b = theirs.json()["id"]

    async def visible(token: str) -> list[str]:
        return [j["id"] for j in (await secured.get("/v1/jobs", headers=bearer(token))).json()]

    assert await visible(USER_A) == [job_a]
    assert await visible(USER_B) == [job_b]
    assert await visible(ADMIN) == [job_a, job_b]
    for method, path in (("GET", f"/v1/jobs/{job_a}"), ("POST", f"/v1/jobs/{job_a}/cancel")):
        response = await secured.request(method, path, headers=bearer(USER_B))
        assert response.status_code == 404, (method, path)
        assert response.json()["detail"] == f"job {job_a!r} not found"
    assert (await secured.get(f"/v1/jobs/{job_a}", headers=bearer(USER_A))).json()[
        "state"
    ] == "PENDING"

    async with asyncio.timeout(10):
        events = await secured.get("/v1/events", params={"follow": "false"}, headers=bearer(USER_B))
    assert job_b in events.text and job_a not in events.text


def test_tenant_scoping_and_token_lookup() -> None:
    job = Job(id="job-1", name="j", spec=JobSpec(name="j"), tenant="team-a")
    legacy = Job(id="job-0", name="j", spec=JobSpec(name="j"))  # submitted without tokens
    assert may_see(Caller("user", "team-a"), job)
    assert not may_see(Caller("user", "team-b"), job)
    assert not may_see(Caller("user", "team-a"), legacy)
    assert may_see(Caller("admin", "ops"), job) and may_see(Caller("admin", "ops"), legacy)

    grants = ApiSettings(api_tokens=TOKENS).api_tokens
    assert grant_for(USER_B, grants) == grants[USER_B]
    assert grant_for(USER_B[:-1], grants) is None and grant_for("", grants) is None


def test_settings_refuse_weak_tokens_without_echoing_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("UNICRON_API_TOKENS", '{"tiny-secret": {"role": "admin", "tenant": "ops"}}')
    with pytest.raises(SystemExit) as exited:
        load_settings()
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "UNICRON_API_TOKENS" in err and "shorter than 16" in err and "tiny-secret" not in err

    monkeypatch.setenv("UNICRON_API_TOKENS", f'{{"{ADMIN}": {{"role": "root", "tenant": "x"}}}}')
    with pytest.raises(SystemExit):
        load_settings()
    err = capsys.readouterr().err
    assert "<token>.role" in err and ADMIN not in err


def test_tokens_lift_the_loopback_guard() -> None:
    check_bind(ApiSettings(api_host="0.0.0.0", api_tokens=TOKENS))  # returns: may bind
    with pytest.raises(SystemExit):
        check_bind(ApiSettings(api_host="0.0.0.0"))
