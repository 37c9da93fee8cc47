"""While Redis or NATS is away, /v1 calls answer 503 with a reason and Retry-After, not 500."""

from __future__ import annotations

from pathlib import Path

import httpx
import nats.errors
from unicron.services.api.app import create_app
from unicron.services.api.settings import ApiSettings
from unicron.shared.servers.embedded import start_redis

from tests.api.live import eventually, serve_api


async def test_redis_down_is_503_with_retry_after_and_heals(nats_url: str, tmp_path: Path) -> None:
    redis = start_redis(tmp_path / "own-redis")
    try:
        with serve_api(nats_url, redis.url) as url:
            async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
                assert (await client.get("/v1/jobs")).status_code == 200
                redis.process.kill()
                redis.process.wait()
                calls = [client.get("/v1/jobs"), client.get("/v1/nodes"), client.get("/v1/jobs/x")]
                for call in calls:
                    response = await call
                    assert response.status_code == 503, response.text
                    assert response.headers["Retry-After"].isdigit()
                    assert response.json()["detail"].startswith("state store unavailable")
                redis.restart()

                async def healed() -> bool:
                    return (await client.get("/v1/jobs")).status_code == 200

                await eventually(healed, timeout_s=15)
    finally:
        redis.stop()


async def test_a_bus_that_is_not_connected_is_503() -> None:
    app = create_app(ApiSettings())

    @app.get("/v1/probe-bus")
    async def probe() -> None:
        raise nats.errors.ConnectionClosedError

    transport = httpx.ASGITransport(app=app)  # no lifespan: nothing connects
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        response = await client.get("/v1/probe-bus")
    assert response.status_code == 503
    assert response.json()["detail"].startswith("event bus unavailable")
    assert response.headers["Retry-After"]
