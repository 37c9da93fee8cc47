"""POSTing one event to one webhook's receiver until it takes it, and what its answer means.

A 2xx is success; a redirect, or a 4xx other than 408 and 429, is the receiver refusing the
event, which retrying cannot change; anything else (a 5xx, no connection, a timeout) is
retried after an exponential back-off with full jitter (``UNICRON_WEBHOOK_RETRY_*``) until the
give-up time or attempt count. Each failed attempt is written into the webhook's status, so an
operator sees a receiver that is away while its event is still held
(services/api/webhook_delivery.py holds it).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)
from unicron.services.api.settings import ApiSettings
from unicron.shared.contracts.models import now
from unicron.shared.contracts.webhooks import Webhook
from unicron.shared.store.webhooks import WebhookStore

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


def signature(secret: str, body: bytes) -> str:
    """The ``X-Unicron-Signature`` of ``body``: a receiver recomputes it to check the sender."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Poster:
    """The HTTP client of one API process's webhooks, with their retry policy."""

    def __init__(self, webhooks: WebhookStore, settings: ApiSettings) -> None:
        self._webhooks = webhooks
        self._retry = RetryPolicy.of(settings)
        self._http = httpx.AsyncClient(
            follow_redirects=False, timeout=settings.webhook_timeout_s, trust_env=False
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def send(
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
