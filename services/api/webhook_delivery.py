"""Delivering the event stream to webhooks: at least once, in order, through receiver outages.

Each webhook reads ``UNICRON_EVENTS`` through a durable JetStream pull consumer of its own
(``webhook-<id>``, filtered on its types), made when the webhook is posted, deleted with it, and
made again on start for every stored webhook, so Redis holds all there is to rebuild. The
consumer hands out one message at a time (``max_ack_pending=1``): several API replicas may pull
from it and the receiver still gets the events in order.

A message is held until its receiver took it: each failed POST is retried after an
exponential back-off with full jitter (``UNICRON_WEBHOOK_RETRY_*``), while the message is kept
from redelivery with ``in_progress``. A 2xx is success; a redirect, or a 4xx other than 408 and
429, is the receiver refusing the event, which is dead-lettered at once; anything else (a 5xx,
no connection, a timeout) is retried until the give-up time or attempt count, then
dead-lettered with its last error, and the next event goes. The message is acked only after
that, so an event whose POST succeeded but whose ack was lost comes again: receivers dedupe by
``X-Unicron-Event-Id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
from dataclasses import dataclass

import httpx
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)
from unicron.services.api.access import Caller
from unicron.services.api.eventscope import Visible, visibility
from unicron.services.api.settings import ApiSettings
from unicron.services.api.webhook_formats import render
from unicron.shared.bus.bus import parse_event
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
# Retried: the receiver may take the event later. Other 4xx mean it never will.
RETRIED_4XX = (408, 429)
USER_AGENT = "unicron-webhooks"


class DeliveryRefusedError(Exception):
    """The receiver refused the event (a 4xx, a redirect): retrying cannot help."""


class DeliveryFailedError(Exception):
    """No answer, or a 5xx: the receiver may take the event on a later attempt."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long one event is retried: the back-off ``base_s * 2**n`` (at most ``cap_s``),
    drawn at random below it, until ``give_up_s`` or ``max_attempts``."""

    base_s: float
    cap_s: float
    give_up_s: float
    max_attempts: int

    @classmethod
    def of(cls, settings: ApiSettings) -> RetryPolicy:
        return cls(
            settings.webhook_retry_base_s,
            settings.webhook_retry_cap_s,
            settings.webhook_give_up_s,
            settings.webhook_max_attempts,
        )


def consumer_name(webhook_id: str) -> str:
    return f"webhook-{webhook_id}"


def signature(secret: str, body: bytes) -> str:
    """The ``X-Unicron-Signature`` of ``body``: a receiver recomputes it to check the sender."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


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
        self, js: JetStreamContext, state: StateStore, webhooks: WebhookStore, settings: ApiSettings
    ) -> None:
        self._js, self._state, self._webhooks = js, state, webhooks
        self._retry = RetryPolicy.of(settings)
        self._external_url = f"http://{settings.api_host}:{settings.api_port}"
        self._http = httpx.AsyncClient(
            follow_redirects=False, timeout=settings.webhook_timeout_s, trust_env=False
        )
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        """Deliver every stored webhook again (their consumers kept their place)."""
        for webhook in await self._webhooks.all():
            await self.add(webhook)

    async def add(self, webhook: Webhook) -> None:
        """Make the webhook's consumer (from now on) and start delivering to it."""
        await self._js.add_consumer(EVENTS_STREAM, _consumer_config(webhook))
        if webhook.id not in self._tasks:
            task = asyncio.create_task(self._run(webhook), name=f"webhook-{webhook.id}")
            self._tasks[webhook.id] = task
            task.add_done_callback(lambda _: self._tasks.pop(webhook.id, None))

    async def remove(self, webhook_id: str) -> None:
        """Stop delivering and delete the consumer: nothing more goes out."""
        task = self._tasks.get(webhook_id)
        if task is not None:
            await cancel_and_wait([task], f"webhook {webhook_id}")
        with contextlib.suppress(NotFoundError):
            await self._js.delete_consumer(EVENTS_STREAM, consumer_name(webhook_id))

    async def close(self) -> None:
        await cancel_and_wait(list(self._tasks.values()), "webhook deliveries")
        await self._http.aclose()

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
            await msg.ack()
            outage.ok()
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
            attempts, failure = await self._send(webhook, body, headers)
        finally:
            await cancel_and_wait([keep], "webhook message keep-alive")
        if failure is None:
            await self._webhooks.delivered(webhook.id, now())
            return
        letter = WebhookDeadLetter(
            webhook_id=webhook.id, event_id=event.id, event_type=event.type, reason=failure,
            attempts=attempts, at=now(),
        )  # fmt: skip
        log.warning("webhook event dead-lettered", webhook_id=webhook.id, event_id=event.id,
                    reason=failure, attempts=attempts)  # fmt: skip
        await self._webhooks.dead_lettered(letter)

    async def _send(
        self, webhook: Webhook, body: bytes, headers: dict[str, str]
    ) -> tuple[int, str | None]:
        """POST until the receiver takes it: (attempts, None), or (attempts, why it failed)."""
        policy, attempts = self._retry, 0
        retrying = AsyncRetrying(
            wait=wait_random_exponential(multiplier=policy.base_s, max=policy.cap_s),
            stop=stop_after_delay(policy.give_up_s) | stop_after_attempt(policy.max_attempts),
            retry=retry_if_exception_type(DeliveryFailedError),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    attempts += 1
                    await self._post(webhook, body, headers)
        except DeliveryFailedError as exc:
            return attempts, f"gave up after {attempts} attempts; last: {exc}"
        except DeliveryRefusedError as exc:
            return attempts, str(exc)
        return attempts, None

    async def _post(self, webhook: Webhook, body: bytes, headers: dict[str, str]) -> None:
        try:
            try:
                response = await self._http.post(str(webhook.url), content=body, headers=headers)
            except httpx.HTTPError as exc:
                raise DeliveryFailedError(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
            _check_answer(response)
        except (DeliveryFailedError, DeliveryRefusedError) as exc:
            await self._webhooks.failed(webhook.id, str(exc), now())
            raise


def _check_answer(response: httpx.Response) -> None:
    code = response.status_code
    if response.is_success:
        return
    if response.is_redirect:
        where = response.headers.get("location")
        raise DeliveryRefusedError(f"answered {code} to {where!r}: redirects are not followed")
    text = response.text[:200]
    if 400 <= code < 500 and code not in RETRIED_4XX:
        raise DeliveryRefusedError(f"the receiver refused the event: {code} {text}")
    raise DeliveryFailedError(f"answered {code} {text}".rstrip())


async def _keep_held(msg: Msg) -> None:
    """Tell the server the message is still being worked on, so it is not handed out again."""
    while True:
        await asyncio.sleep(ACK_WAIT_S / 3)
        with contextlib.suppress(Exception):  # NATS away: the next one may get through
            await msg.in_progress()
