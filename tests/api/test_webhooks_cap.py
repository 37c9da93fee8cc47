"""The per-tenant cap on webhooks (UNICRON_WEBHOOKS_PER_TENANT), through a real API over real
NATS and Redis: a tenant's users may have that many between them, the next is a 409 that
stores nothing, even when they ask at once; other tenants and admins are not held back."""

from __future__ import annotations

import asyncio

import httpx

from tests.api.factories import ADMIN, TOKENS, USER_A, USER_B, bearer
from tests.api.live import serve_api
from tests.api.test_webhooks import receiver
from tests.api.webhook_receiver import Receiver

__all__ = ["receiver"]  # fixture
CAP = 2


async def test_a_tenant_has_at_most_its_cap_of_webhooks_and_nothing_more_is_stored(
    nats_url: str, redis_url: str, receiver: Receiver
) -> None:
    spec = {"url": receiver.url}
    admin, user_a, user_b = bearer(ADMIN), bearer(USER_A), bearer(USER_B)
    with serve_api(nats_url, redis_url, api_tokens=TOKENS, webhooks_per_tenant=CAP) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as api:
            tries = [api.post("/v1/webhooks", json=spec, headers=user_a) for _ in range(5)]
            answers = await asyncio.gather(*tries)  # at once: none may slip past the count
            assert sorted(a.status_code for a in answers) == [201] * CAP + [409] * (5 - CAP)
            refused = next(a for a in answers if a.status_code == 409).json()["detail"]
            assert "'team-a'" in refused and "UNICRON_WEBHOOKS_PER_TENANT" in refused
            mine = (await api.get("/v1/webhooks", headers=user_a)).json()
            assert len(mine) == CAP
            assert len((await api.get("/v1/webhooks", headers=admin)).json()) == CAP

            # Another tenant's users have their own cap; an admin's webhooks are not counted.
            assert (await api.post("/v1/webhooks", json=spec, headers=user_b)).status_code == 201
            for _ in range(CAP + 1):
                made = await api.post("/v1/webhooks", json=spec, headers=admin)
                assert made.status_code == 201

            # A deleted webhook frees its place.
            gone = await api.delete(f"/v1/webhooks/{mine[0]['id']}", headers=user_a)
            assert gone.status_code == 204
            assert (await api.post("/v1/webhooks", json=spec, headers=user_a)).status_code == 201
            assert (await api.post("/v1/webhooks", json=spec, headers=user_a)).status_code == 409
