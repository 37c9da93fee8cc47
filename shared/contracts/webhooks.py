"""Webhooks and the event filter: which events a reader wants, where a webhook sends them, in
which format, and how its deliveries went.

:class:`EventFilter` is the one filter of the event stream: the SSE route applies it to a
stream, and every webhook is one (a webhook's spec extends it). A webhook's secret is kept in
its stored record (the HMAC of each delivery needs it) and never shown: :class:`WebhookView`
only says whether one is set.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import (
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_serializer,
    field_validator,
)
from unicron.shared.contracts.events import EVENT_SUBJECT_PREFIX, EVENT_TYPES, CloudEvent

# A short HMAC key can be found by trying: as long as an API token at least.
MIN_SECRET_CHARS = 16
# The dead letters a webhook's status keeps to show; older ones are counted, not kept.
RECENT_DEAD_LETTERS = 20
# Core NATS (not stored): an API replica that added or deleted a webhook tells the others, which
# then read that webhook's record; a notice lost is made good by their periodic reconcile.
WEBHOOKS_CHANGED_SUBJECT = "unicron.webhooks.changed"


class EventFilter(BaseModel):
    """Which events a reader wants: those of ``types`` (none: every type) and about
    ``job_id`` (None: every job's and the cluster's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    types: list[str] = Field(
        default_factory=list, description="event types to keep; empty: every type"
    )
    job_id: str | None = Field(
        None, min_length=1, max_length=128, description="keep only the events about this job"
    )

    @field_validator("types")
    @classmethod
    def _known_types(cls, types: list[str]) -> list[str]:
        unknown = [t for t in types if t not in EVENT_TYPES]
        if unknown:
            raise ValueError(
                f"unknown event type(s) {', '.join(map(repr, unknown))}; "
                f"known types: {', '.join(EVENT_TYPES)}"
            )
        return list(dict.fromkeys(types))  # asked twice is asked once

    @property
    def subjects(self) -> list[str]:
        """The stream subjects that hold the wanted types."""
        return [EVENT_SUBJECT_PREFIX + t for t in self.types] or [EVENT_SUBJECT_PREFIX + ">"]

    def matches(self, event: CloudEvent) -> bool:
        if self.types and event.type not in self.types:
            return False
        return self.job_id is None or self.job_id in jobs_of(event)


def jobs_of(event: CloudEvent) -> set[str]:
    """The jobs an event is about: its ``job_id``, or every job a plan moves."""
    data: dict[str, Any] = event.data
    found = {data["job_id"]} if isinstance(data.get("job_id"), str) else set()
    for planned in data.get("jobs") or ():
        if isinstance(planned, dict) and isinstance(planned.get("job_id"), str):
            found.add(planned["job_id"])
    return found


class WebhookFormat(str, Enum):
    """The body a webhook receives for each event."""

    CLOUDEVENTS = "cloudevents"  # CloudEvents 1.0 structured JSON
    SLACK = "slack"  # {"text": one line a person reads}
    ALERTMANAGER = "alertmanager"  # Alertmanager's webhook payload, version 4


class WebhookTarget(EventFilter):
    """Where a webhook sends the events it wants, and in which format."""

    url: AnyHttpUrl = Field(description="http(s) URL the events are POSTed to")
    format: WebhookFormat = WebhookFormat.CLOUDEVENTS


class WebhookSpec(WebhookTarget):
    """A webhook as posted to ``POST /v1/webhooks``."""

    secret: SecretStr | None = Field(
        None,
        min_length=MIN_SECRET_CHARS,
        max_length=256,
        description="signs each body: X-Unicron-Signature: sha256=<hex HMAC-SHA256>",
    )


class Webhook(WebhookSpec):
    """A stored webhook: its spec, and whose it is (what it may see is what its owner may)."""

    id: str
    tenant: str | None = Field(description="the tenant of the token that made it")
    admin: bool = Field(description="made by an admin: sees every event, else its tenant's")
    created_at: float

    @field_serializer("secret", when_used="json")
    def _stored_secret(self, secret: SecretStr | None) -> str | None:
        # The stored record keeps the key itself; the API answers with WebhookView only.
        return None if secret is None else secret.get_secret_value()


class WebhookChanged(BaseModel):
    """The notice on ``WEBHOOKS_CHANGED_SUBJECT``: this webhook was added or deleted; its
    record in Redis says which."""

    webhook_id: str


class WebhookDeadLetter(BaseModel):
    """An event a webhook gave up on, and why: kept in the webhook's status, and the payload
    of its ``DeadLetter`` on ``unicron.deadletter``."""

    webhook_id: str
    event_id: str
    event_type: str
    reason: str
    attempts: int
    at: float


class WebhookStatus(BaseModel):
    """How a webhook's deliveries went, since it was made."""

    delivered: int = 0
    last_success_at: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    consecutive_failures: int = 0
    dead_letters: int = 0
    recent_dead_letters: list[WebhookDeadLetter] = Field(
        default_factory=list, description=f"the last {RECENT_DEAD_LETTERS}, newest first"
    )


class WebhookView(WebhookTarget):
    """A webhook as the API shows it: never its secret, only whether it has one."""

    id: str
    tenant: str | None
    created_at: float
    secret_set: bool
    status: WebhookStatus

    @classmethod
    def of(cls, webhook: Webhook, status: WebhookStatus) -> WebhookView:
        shown = webhook.model_dump(exclude={"secret", "admin"})
        return cls(**shown, secret_set=webhook.secret is not None, status=status)
