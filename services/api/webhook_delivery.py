"""Delivering the event stream to webhooks: at least once, in order, through receiver outages.

Each webhook reads ``UNICRON_EVENTS`` through a durable JetStream pull consumer of its own
(``webhook-<id>``, filtered on its types), made when the webhook is posted, deleted with it, and
made again on start for every stored webhook, so Redis holds all there is to rebuild. Every API
replica delivers every webhook (services/api/webhook_sync.py tells each of the others' changes);
the consumer hands out one message at a time (``max_ack_pending=1``), so the replicas pulling
from it still give the receiver the events in order, and when one stops another goes on.

A message is held until its receiver took it: the POST is retried (services/api/webhook_post.py)
while the message is kept from redelivery with ``in_progress``. An event the receiver refused,
or that outlived the give-up time, is dead-lettered: into the webhook's status, and onto
``unicron.deadletter`` with every other service's dead letters; then the next event goes. A
success is acked before its count is written, a dead letter only once it is kept, so an event
whose ack was lost comes again: receivers dedupe by ``X-Unicron-Event-Id``. A replica that stops
hands its held message back at once; one that dies, after ``ACK_WAIT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from unicron.services.api.access import Caller
from unicron.services.api.eventscope import Visible, visibility
from unicron.services.api.settings import ApiSettings
from unicron.services.api.webhook_formats import render
from unicron.services.api.webhook_post import USER_AGENT, Poster, signature
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.bus.delivery import PARSE_ERRORS
from unicron.shared.bus.streams import EVENTS_STREAM
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import now
from unicron.shared.contracts.webhooks import Webhook, WebhookDeadLetter
from unicron.shared.logging import get_logger
from unicron.shared.outage import Outage
from unicron.shared.store.state import StateStore
from unicron.shared.store.webhooks import WebhookStore
from unicron.shared.tasks import cancel_and_wait

log = get_logger(component="api.webhooks")
# How long a held message waits unacked before the server hands it to another replica; a live
# deliverer renews it every third of that, however long the receiver stays away.
ACK_WAIT_S = 30.0
FETCH_WAIT_S = 5.0


def consumer_name(webhook_id: str) -> str:
    return f"webhook-{webhook_id}"


def _consumer_config(webhook: Webhook) -> ConsumerConfig:
    subjects = webhook.subjects
    return ConsumerConfig(
        durable_name=consumer_name(webhook.id),
        deliver_policy=DeliverPolicy.NEW,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ACK_WAIT_S,
        max_deliver=-1,  # this deliverer dead-letters; the server must never drop a message
        max_ack_pending=1,
        filter_subject=subjects[0] if len(subjects) == 1 else None,
        filter_subjects=subjects if len(subjects) > 1 else None,
    )


class WebhookDeliverer:
    """The webhooks' delivery tasks of one API process."""

    def __init__(
        self, bus: Bus, state: StateStore, webhooks: WebhookStore, settings: ApiSettings
    ) -> None:
        self._bus, self._js, self._state, self._webhooks = bus, bus.js, state, webhooks
        self._poster = Poster(webhooks, settings)
        self._external_url = f"http://{settings.api_host}:{settings.api_port}"
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # One change of what this process delivers at a time: a notice, the reconcile and a
        # request may all follow or drop the same webhook at once.
        self._changing = asyncio.Lock()

    @property
    def following(self) -> frozenset[str]:
        """The ids of the webhooks this process delivers now."""
        return frozenset(self._tasks)

    async def follow(self, webhook: Webhook) -> bool:
        """Deliver ``webhook`` from this process too, making its consumer (from now on) if it
        has none; idempotent. False when it was deleted meanwhile: then nothing runs."""
        async with self._changing:
            if webhook.id in self._tasks:
                return True
            await self._js.add_consumer(EVENTS_STREAM, _consumer_config(webhook))
            # Read again once the consumer exists: a DELETE forgets the record before it
            # deletes the consumer, so either this sees it gone, or that deletes this consumer.
            if await self._webhooks.get(webhook.id) is None:
                await self._delete_consumer(webhook.id)
                return False
            task = asyncio.create_task(self._run(webhook), name=f"webhook-{webhook.id}")
            self._tasks[webhook.id] = task
            task.add_done_callback(self._forget_task)
            return True

    async def drop(self, webhook_id: str) -> None:
        """Stop delivering and delete the consumer: nothing more goes out. Idempotent."""
        async with self._changing:
            task = self._tasks.get(webhook_id)
            if task is not None:
                await cancel_and_wait([task], f"webhook {webhook_id}")
            await self._delete_consumer(webhook_id)

    async def close(self) -> None:
        await cancel_and_wait(list(self._tasks.values()), "webhook deliveries")
        await self._poster.close()

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        # By identity: a task that ended may already have a successor under its webhook's id.
        for webhook_id, running in list(self._tasks.items()):
            if running is task:
                del self._tasks[webhook_id]

    async def _delete_consumer(self, webhook_id: str) -> None:
        with contextlib.suppress(NotFoundError):
            await self._js.delete_consumer(EVENTS_STREAM, consumer_name(webhook_id))

    async def _run(self, webhook: Webhook) -> None:
        owner = Caller(role="admin" if webhook.admin else "user", tenant=webhook.tenant)
        visible = visibility(owner, self._state)
        outage = Outage("webhook delivery", component="api.webhooks", webhook_id=webhook.id)
        sub = await self._js.pull_subscribe_bind(
            durable=consumer_name(webhook.id), stream=EVENTS_STREAM
        )
        try:
            while True:
                try:
                    msgs = await sub.fetch(1, timeout=FETCH_WAIT_S)
                except Exception as exc:
                    if not await self._still_wanted(webhook, exc, outage):
                        return
                    continue
                for msg in msgs:
                    await self._handle(webhook, msg, visible, outage)
        finally:
            with contextlib.suppress(Exception):  # the connection may already be gone
                await sub.unsubscribe()

    async def _still_wanted(self, webhook: Webhook, exc: Exception, outage: Outage) -> bool:
        """After a fetch that got nothing: False once the webhook was deleted (by another
        replica, say); its consumer is made again if NATS lost it; an outage is waited out."""
        try:
            if await self._webhooks.get(webhook.id) is None:
                # This task may have made the consumer again just as the DELETE deleted it.
                await self._delete_consumer(webhook.id)
                return False
            if isinstance(exc, NotFoundError):
                await self._js.add_consumer(EVENTS_STREAM, _consumer_config(webhook))
            elif not isinstance(exc, nats.errors.TimeoutError):
                raise exc
        except Exception as error:
            outage.failed(error)
            await outage.pause()
        return True

    async def _handle(self, webhook: Webhook, msg: Msg, visible: Visible, outage: Outage) -> None:
        try:
            event = parse_event(msg.data)
        except PARSE_ERRORS:
            log.warning("skipping a malformed event", webhook_id=webhook.id, subject=msg.subject)
            await msg.term()
            return
        try:
            if webhook.matches(event) and await visible(event):
                await self._deliver(webhook, event, msg)
            else:
                await msg.ack()
            outage.ok()
        except asyncio.CancelledError:
            # This process stops delivering it: another replica takes the message now rather
            # than after ACK_WAIT_S (a message already acked ignores this).
            with contextlib.suppress(Exception):
                await msg.nak()
            raise
        except Exception as exc:  # Redis or NATS away: the server hands the message back
            outage.failed(exc)
            with contextlib.suppress(Exception):
                await msg.nak(delay=outage.delay())
            await outage.pause()

    async def _deliver(self, webhook: Webhook, event: CloudEvent, msg: Msg) -> None:
        body, content_type = render(webhook, event, self._external_url)
        headers = {
            "Content-Type": content_type, "User-Agent": USER_AGENT,
            "X-Unicron-Event-Id": event.id, "X-Unicron-Event-Type": event.type,
            "X-Unicron-Webhook-Id": webhook.id,
        }  # fmt: skip
        if webhook.secret is not None:
            headers["X-Unicron-Signature"] = signature(webhook.secret.get_secret_value(), body)
        keep = asyncio.create_task(_keep_held(msg))
        try:
            attempts, failure = await self._poster.send(webhook, body, headers)
        finally:
            await cancel_and_wait([keep], "webhook message keep-alive")
        if failure is None:
            await msg.ack()  # first: a replica stopping now must not send it again
            await self._webhooks.delivered(webhook.id, now())
            return
        letter = WebhookDeadLetter(
            webhook_id=webhook.id, event_id=event.id, event_type=event.type, reason=failure,
            attempts=attempts, at=now(),
        )  # fmt: skip
        await self._dead_letter(letter, msg.subject)
        await msg.ack()  # last: a letter lost on the way is made again from the redelivery

    async def _dead_letter(self, letter: WebhookDeadLetter, subject: str) -> None:
        """Keep ``letter`` in the webhook's status, and on the dead-letter stream, which the
        bus's helper also counts in ``unicron_dead_letters_total{service="api"}``."""
        await self._webhooks.dead_lettered(letter)
        reason = f"webhook {letter.webhook_id}: {letter.reason}"
        payload = letter.model_dump_json().encode()
        await self._bus.dead_letter(subject, payload, reason, letter.attempts)


async def _keep_held(msg: Msg) -> None:
    """Tell the server the message is still being worked on, so it is not handed out again."""
    while True:
        await asyncio.sleep(ACK_WAIT_S / 3)
        with contextlib.suppress(Exception):  # NATS away: the next one may get through
            await msg.in_progress()
