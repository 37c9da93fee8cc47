"""Webhooks across API replicas, over real NATS and Redis: a webhook posted on one replica is
delivered by another once the first stops, in order and each once; one deleted on a replica
stops in the others; what a lost notice would have said, the reconcile finds in Redis; and a
replica that stops while holding an event hands it on at once."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from nats.js.errors import NotFoundError
from unicron.services.api.webhook_delivery import consumer_name
from unicron.shared.bus.bus import Bus
from unicron.shared.bus.streams import EVENTS_STREAM
from unicron.shared.contracts.models import now
from unicron.shared.contracts.webhooks import Webhook
from unicron.shared.store.state import StateStore
from unicron.shared.store.webhooks import WebhookStore

from tests.api.live import eventually, serve_app
from tests.api.test_webhooks import _at_least, received, receiver, submitted
from tests.api.webhook_receiver import Receiver

__all__ = ["receiver"]  # fixture
# No reconcile within a test: what a replica learns, it learns from the notice.
NOTICES_ONLY = {"webhook_reconcile_s": 3600.0}


def follows(
    app: FastAPI, webhook_id: str, wanted: bool = True
) -> Callable[[], Coroutine[Any, Any, bool]]:
    """A probe: whether ``app`` delivers the webhook now, as ``wanted``."""

    async def probe() -> bool:
        return (webhook_id in app.state.webhook_deliverer.following) is wanted

    return probe


async def publish(bus: Bus, *jobs: str) -> list[str]:
    return [(await bus.publish_event(submitted(job))).id for job in jobs]


async def test_a_webhook_posted_on_one_replica_goes_on_through_another_when_it_stops(
    nats_url: str, redis_url: str, bus: Bus, receiver: Receiver
) -> None:
    with serve_app(nats_url, redis_url, **NOTICES_ONLY) as (b_url, b_app):
        with serve_app(nats_url, redis_url, **NOTICES_ONLY) as (a_url, _):
            async with httpx.AsyncClient(base_url=a_url, timeout=10) as a:
                made = await a.post("/v1/webhooks", json={"url": receiver.url})
            assert made.status_code == 201, made.text
            hook_id = made.json()["id"]
            await eventually(follows(b_app, hook_id))  # B was told; it did not restart
            before = await publish(bus, "job-1", "job-2", "job-3")
            assert await received(receiver, 3) == before  # from A or B, one at a time
        after = await publish(bus, "job-4", "job-5", "job-6")  # A is gone
        assert await received(receiver, 6) == before + after, "in order, each once"

        witness = Receiver()
        try:
            with serve_app(nats_url, redis_url, **NOTICES_ONLY) as (_, a_app):
                assert hook_id in a_app.state.webhook_deliverer.following  # A again
                async with httpx.AsyncClient(base_url=b_url, timeout=10) as b:
                    made = await b.post("/v1/webhooks", json={"url": witness.url})
                    assert made.status_code == 201
                    assert (await b.delete(f"/v1/webhooks/{hook_id}")).status_code == 204
                await eventually(follows(a_app, hook_id, wanted=False))
                last = await publish(bus, "job-7")
                assert await received(witness, 1) == last
                with pytest.raises(NotFoundError):  # nobody made it again
                    await bus.js.consumer_info(EVENTS_STREAM, consumer_name(hook_id))
        finally:
            witness.down()
    assert receiver.event_ids() == before + after


async def test_the_reconcile_finds_a_webhook_added_or_deleted_without_a_notice(
    nats_url: str, redis_url: str, bus: Bus, state: StateStore, receiver: Receiver
) -> None:
    webhooks = WebhookStore(state.redis)
    with serve_app(nats_url, redis_url, webhook_reconcile_s=0.2) as (_, app):
        # As a replica would store it whose notice never came.
        unheard = Webhook(url=receiver.url, id="wh-unheard", tenant=None, admin=True,
                          created_at=now())  # fmt: skip
        await webhooks.put(unheard)
        await eventually(follows(app, unheard.id))
        event = await publish(bus, "job-1")
        assert await received(receiver, 1) == event

        await webhooks.delete(unheard.id)
        await eventually(follows(app, unheard.id, wanted=False))
        with pytest.raises(NotFoundError):
            await bus.js.consumer_info(EVENTS_STREAM, consumer_name(unheard.id))


async def test_a_replica_that_stops_while_holding_an_event_hands_it_on_at_once(
    nats_url: str, redis_url: str, bus: Bus, receiver: Receiver
) -> None:
    quick = {**NOTICES_ONLY, "webhook_retry_base_s": 0.05, "webhook_retry_cap_s": 0.2}
    with contextlib.ExitStack() as outlives_a:
        with serve_app(nats_url, redis_url, **quick) as (a_url, _):
            async with httpx.AsyncClient(base_url=a_url, timeout=10) as a:
                made = await a.post("/v1/webhooks", json={"url": receiver.url})
                hook_id = made.json()["id"]
                receiver.down()
                held = await publish(bus, "job-1")  # A alone runs: A holds it, retrying

                async def failing() -> bool:
                    status = (await a.get(f"/v1/webhooks/{hook_id}")).json()["status"]
                    return int(status["consecutive_failures"]) >= 1

                await eventually(failing)
            _, b_app = outlives_a.enter_context(serve_app(nats_url, redis_url, **quick))
            assert hook_id in b_app.state.webhook_deliverer.following
        receiver.up()  # A is gone, still holding the event
        # Well before ACK_WAIT_S (30 s), after which the server would hand it on by itself.
        assert await eventually(lambda: _at_least(receiver, 1), timeout_s=10) == held
    assert receiver.event_ids() == held
