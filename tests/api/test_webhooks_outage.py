"""THE webhook promise: a receiver that is down for 30 s while events happen, then comes back,
gets every event, in order, each once — through a real API, NATS and Redis. The 30-s outage is
in the extended suite (CI runs it); the default suite runs the same test with a 3-s one."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from unicron.shared.bus.bus import Bus

from tests.api.live import eventually
from tests.api.test_webhooks import submitted
from tests.api.webhook_receiver import Receiver

EVENTS = 10


@pytest.mark.parametrize("outage_s", [3.0, pytest.param(30.0, marks=pytest.mark.extended)])
async def test_a_receiver_down_then_back_gets_every_event_in_order_once(
    client: httpx.AsyncClient, bus: Bus, outage_s: float
) -> None:
    receiver = Receiver()
    try:
        hook = (await client.post("/v1/webhooks", json={"url": receiver.url})).json()
        path = f"/v1/webhooks/{hook['id']}"
        receiver.down()
        started = time.monotonic()
        published = []
        for n in range(EVENTS):  # spread over the outage, as a cluster's events would be
            published.append((await bus.publish_event(submitted(f"job-{n}"))).id)
            await asyncio.sleep(outage_s / 2 / EVENTS)

        async def failing() -> dict[str, object]:
            status: dict[str, object] = (await client.get(path)).json()["status"]
            return status if int(str(status["consecutive_failures"])) >= 2 else {}

        status = await eventually(failing, timeout_s=outage_s)
        assert "Connect" in str(status["last_error"]) and status["delivered"] == 0
        await asyncio.sleep(outage_s - (time.monotonic() - started))  # the rest of the outage
        receiver.up()

        async def all_in() -> list[str]:
            ids = receiver.event_ids()
            return ids if len(set(ids)) >= EVENTS else []

        ids = await eventually(all_in, timeout_s=30)
        unique = list(dict.fromkeys(ids))  # the receiver dedupes by X-Unicron-Event-Id
        assert unique == published, "every event, in the order published"
        assert len(ids) - len(unique) == 0, f"{len(ids) - len(unique)} sent twice"
        status = (await client.get(path)).json()["status"]
        assert status["delivered"] == EVENTS and status["dead_letters"] == 0
        assert status["consecutive_failures"] == 0
    finally:
        receiver.down()
