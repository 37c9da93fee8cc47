"""Probes and metrics: what an orchestrator and a Prometheus scraper see."""

from __future__ import annotations

import httpx
from unicron.shared.servers.embedded import EmbeddedServer

from tests.api.live import eventually


async def test_ready_until_a_dependency_goes_away(
    client: httpx.AsyncClient, redis_server: EmbeddedServer, nats_server: EmbeddedServer
) -> None:
    assert (await client.get("/livez")).status_code == 200
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"nats": "ok", "redis": "ok"}

    redis_server.stop()

    async def readyz_failed() -> list[str]:
        return list((await client.get("/readyz")).json()["failed"])

    assert await eventually(readyz_failed) == ["redis"]
    assert (await client.get("/readyz")).status_code == 503
    assert (await client.get("/livez")).status_code == 200

    nats_server.stop()

    async def both_failed() -> bool:
        return await readyz_failed() == ["nats", "redis"]

    await eventually(both_failed)


async def test_metrics_count_requests_by_route_and_jobs_by_state(
    client: httpx.AsyncClient,
) -> None:
    job = (await client.post("/v1/jobs", json={"name": "m"})).json()
    await client.get(f"/v1/jobs/{job['id']}")
    await client.get("/v1/jobs/job-000000000000")
    response = await client.get("/metrics")
    assert response.status_code == 200
    text = response.text
    assert 'unicron_jobs{state="PENDING"} 1.0' in text
    assert 'unicron_jobs{state="RUNNING"} 0.0' in text
    route = 'route="/v1/jobs/{job_id}"'
    assert f'unicron_api_requests_total{{method="GET",{route},status="200"}} 1.0' in text
    assert f'unicron_api_requests_total{{method="GET",{route},status="404"}} 1.0' in text
    assert 'unicron_api_request_duration_seconds_count{method="POST",route="/v1/jobs"} 1.0' in text
    requests = [line for line in text.splitlines() if line.startswith("unicron_api_request")]
    assert not [line for line in requests if job["id"] in line]  # route templates, not paths
    # the job's own state gauge is where its id belongs (services/api/state_metrics.py)
    assert f'unicron_job_state{{job="{job["id"]}",name="m",state="PENDING"}} 1.0' in text
