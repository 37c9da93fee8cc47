"""Webhooks: the event stream POSTed to a URL, filtered like ``GET /v1/events``.

An admin manages every webhook, and its webhooks get every event; a user manages the webhooks
of its own tenant (another tenant's are 404, like its jobs), which get only what the user may
see on the stream (services/api/eventscope.py). The secret is never shown again: a webhook
says whether it has one. Delivery is services/api/webhook_delivery.py's, in every replica
(services/api/webhook_sync.py): each change is announced to the others.

A tenant's users may have ``UNICRON_WEBHOOKS_PER_TENANT`` webhooks between them (each is a
consumer on the event stream and a delivery task in every replica); one more is a 409 and
nothing is stored. An admin's webhooks are not counted, under any tenant: the operator's own
alerting must not wait on a tenant deleting one, and admin tokens are few and trusted.
"""

from __future__ import annotations

import contextlib
from typing import Annotated, cast

from fastapi import APIRouter, Depends, HTTPException, Request, Response, status
from unicron.services.api.access import Caller, Principal
from unicron.services.api.deps import SettingsDep, StateDep
from unicron.services.api.errors import errors
from unicron.services.api.eventscope import check_filter
from unicron.services.api.webhook_delivery import WebhookDeliverer
from unicron.services.api.webhook_sync import WebhookSync
from unicron.shared.contracts.models import new_id, now
from unicron.shared.contracts.webhooks import Webhook, WebhookSpec, WebhookView
from unicron.shared.logging import get_logger
from unicron.shared.store.webhooks import WebhookStore

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])
log = get_logger(component="api.webhooks")


def get_deliverer(request: Request) -> WebhookDeliverer:
    return cast(WebhookDeliverer, request.app.state.webhook_deliverer)


def get_webhook_store(request: Request) -> WebhookStore:
    return cast(WebhookStore, request.app.state.webhook_store)


def get_sync(request: Request) -> WebhookSync:
    return cast(WebhookSync, request.app.state.webhook_sync)


DelivererDep = Annotated[WebhookDeliverer, Depends(get_deliverer)]
WebhooksDep = Annotated[WebhookStore, Depends(get_webhook_store)]
SyncDep = Annotated[WebhookSync, Depends(get_sync)]


def _manages(caller: Caller, webhook: Webhook) -> bool:
    """An admin every webhook; a user its tenant's, never an admin's (which sees more)."""
    return caller.admin or (not webhook.admin and webhook.tenant == caller.tenant)


async def _managed(webhooks: WebhookStore, caller: Caller, webhook_id: str) -> Webhook:
    webhook = await webhooks.get(webhook_id)
    if webhook is None or not _manages(caller, webhook):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"webhook {webhook_id!r} not found")
    return webhook


@router.post(
    "", status_code=201, response_model=WebhookView, responses=errors(403, 404, 409, 422)
)  # fmt: skip
async def create_webhook(
    spec: WebhookSpec,
    caller: Principal,
    state: StateDep,
    settings: SettingsDep,
    webhooks: WebhooksDep,
    deliverer: DelivererDep,
    sync: SyncDep,
) -> WebhookView:
    """Deliver every event from now on that ``types`` and ``job_id`` keep (all when unset).
    A tenant's users may have ``UNICRON_WEBHOOKS_PER_TENANT`` webhooks; one more is a 409."""
    await check_filter(caller, state, spec)
    webhook = Webhook(
        **dict(spec), id=new_id("wh"), tenant=caller.tenant, admin=caller.admin, created_at=now()
    )
    await _store(webhooks, webhook, settings.webhooks_per_tenant)
    try:
        await deliverer.follow(webhook)
    except Exception:  # no consumer: a stored webhook that delivers nothing would lie
        await webhooks.delete(webhook.id)
        with contextlib.suppress(Exception):  # its consumer may have been made
            await deliverer.drop(webhook.id)
        await webhooks.forget_status(webhook.id)
        raise
    finally:
        await sync.announce(webhook.id)  # added, or (failed) gone again: the record says
    log.info("webhook created", webhook_id=webhook.id, tenant=caller.tenant,
             types=webhook.types, job_id=webhook.job_id, format=webhook.format.value)  # fmt: skip
    return WebhookView.of(webhook, await webhooks.status(webhook.id))


async def _store(webhooks: WebhookStore, webhook: Webhook, per_tenant: int) -> None:
    if webhook.admin:
        await webhooks.put(webhook)
    elif not await webhooks.put_within(webhook, per_tenant):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"tenant {webhook.tenant!r} already has the most webhooks allowed, {per_tenant} "
            "(UNICRON_WEBHOOKS_PER_TENANT): delete one first",
        )


@router.get("", response_model=list[WebhookView])
async def list_webhooks(caller: Principal, webhooks: WebhooksDep) -> list[WebhookView]:
    """The webhooks the caller manages, oldest first, each with its delivery status."""
    mine = [w for w in await webhooks.all() if _manages(caller, w)]
    return [WebhookView.of(w, await webhooks.status(w.id)) for w in mine]


@router.get("/{webhook_id}", response_model=WebhookView, responses=errors(404, 422))
async def get_webhook(webhook_id: str, caller: Principal, webhooks: WebhooksDep) -> WebhookView:
    """The webhook and how its deliveries went: delivered, errors, dead letters."""
    webhook = await _managed(webhooks, caller, webhook_id)
    return WebhookView.of(webhook, await webhooks.status(webhook.id))


@router.delete("/{webhook_id}", status_code=204, responses=errors(404, 422))
async def delete_webhook(
    webhook_id: str,
    caller: Principal,
    webhooks: WebhooksDep,
    deliverer: DelivererDep,
    sync: SyncDep,
) -> Response:
    """Stop delivering: no event goes out once this returned."""
    await _managed(webhooks, caller, webhook_id)
    # Forgotten first: another replica's delivery that finds its consumer gone then stops
    # instead of making it again.
    await webhooks.delete(webhook_id)
    await deliverer.drop(webhook_id)  # its consumer too: no replica gets another event
    await webhooks.forget_status(webhook_id)  # after the delivery stopped: it writes there
    await sync.announce(webhook_id)  # the others stop their tasks now, not at the reconcile
    log.info("webhook deleted", webhook_id=webhook_id, tenant=caller.tenant)
    return Response(status_code=204)
