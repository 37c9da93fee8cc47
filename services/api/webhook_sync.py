"""Every API replica delivers every webhook: each learns of the webhooks the others add and
delete within moments, and stops delivering a deleted one.

Redis is the truth. A replica that added or deleted a webhook says so on core NATS
(``WEBHOOKS_CHANGED_SUBJECT``, a :class:`WebhookChanged` naming it); every replica, itself
included, then reads that webhook's record and starts or stops delivering it to match. A notice
is not stored, so one can be missed (a replica reconnecting, or starting just then): every
``UNICRON_WEBHOOK_RECONCILE_S`` each replica also compares what it delivers with every stored
webhook and makes good the difference. Both only bring this replica in line with Redis, so a
notice twice, or a reconcile crossing a notice, changes nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from unicron.services.api.webhook_delivery import WebhookDeliverer
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.webhooks import WEBHOOKS_CHANGED_SUBJECT, WebhookChanged
from unicron.shared.logging import get_logger
from unicron.shared.store.webhooks import WebhookStore
from unicron.shared.tasks import cancel_and_wait

log = get_logger(component="api.webhooks")


class WebhookSync:
    """Keeps one replica's :class:`WebhookDeliverer` in line with the webhooks in Redis."""

    def __init__(
        self, bus: Bus, webhooks: WebhookStore, deliverer: WebhookDeliverer, every_s: float
    ) -> None:
        self._bus, self._webhooks, self._deliverer = bus, webhooks, deliverer
        self._every_s = every_s
        self._sub: Subscription | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Deliver every stored webhook, and keep doing so as they come and go."""
        # Listening first: a webhook added while the first reconcile reads is not missed.
        self._sub = await self._bus.nc.subscribe(WEBHOOKS_CHANGED_SUBJECT, cb=self._on_notice)
        await self.reconcile()
        self._task = asyncio.create_task(self._reconcile_every(), name="webhook-reconcile")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task], "webhook reconcile")
        if self._sub is not None:
            with contextlib.suppress(Exception):  # the connection may already be gone
                await self._sub.unsubscribe()

    async def announce(self, webhook_id: str) -> None:
        """Tell every replica that ``webhook_id`` was added or deleted; one the notice misses
        learns it at its next reconcile, so a failure here is only logged."""
        notice = WebhookChanged(webhook_id=webhook_id).model_dump_json().encode()
        try:
            await self._bus.nc.publish(WEBHOOKS_CHANGED_SUBJECT, notice)
        except Exception as exc:
            log.warning("webhook change not announced", webhook_id=webhook_id, error=repr(exc))

    async def settle(self, webhook_id: str) -> None:
        """Deliver the webhook if it is stored; stop if it was deleted."""
        # Read what runs before the record: ids are never reused, so a webhook running then
        # and missing from Redis after was deleted, not added meanwhile.
        was_running = webhook_id in self._deliverer.following
        webhook = await self._webhooks.get(webhook_id)
        if webhook is not None:
            await self._deliverer.follow(webhook)
        elif was_running:
            await self._forget(webhook_id)

    async def reconcile(self) -> None:
        """Deliver every stored webhook, and no other (see :meth:`settle` on the order)."""
        running = self._deliverer.following
        stored = await self._webhooks.all()
        for webhook in stored:
            if webhook.id not in running:
                await self._each(webhook.id, self._deliverer.follow(webhook))
        for webhook_id in running - {w.id for w in stored}:
            await self._each(webhook_id, self._forget(webhook_id))

    async def _each(self, webhook_id: str, change: Awaitable[object]) -> None:
        """One webhook's change: its failure (NATS refusing its consumer, say) must not hold
        the others back; the next reconcile tries it again."""
        try:
            await change
        except Exception as exc:
            log.warning("webhook not reconciled", webhook_id=webhook_id, error=repr(exc))

    async def _forget(self, webhook_id: str) -> None:
        log.info("webhook deleted elsewhere; delivery stopped", webhook_id=webhook_id)
        await self._deliverer.drop(webhook_id)
        # This replica's delivery may have written the status after the DELETE cleared it.
        await self._webhooks.forget_status(webhook_id)

    async def _on_notice(self, msg: Msg) -> None:
        try:
            await self.settle(WebhookChanged.model_validate_json(msg.data).webhook_id)
        except Exception as exc:  # Redis or NATS away, or a stray message: the reconcile heals
            log.warning("webhook notice not applied", error=repr(exc))

    async def _reconcile_every(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            try:
                await self.reconcile()
            except Exception as exc:  # Redis or NATS away: the next round tries again
                log.warning("webhook reconcile failed", error=repr(exc))
