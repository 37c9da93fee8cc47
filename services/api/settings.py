"""Settings of the API service (``UNICRON_API_*`` and the common ``UNICRON_*`` variables)."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from unicron.shared.settings import CommonSettings

Role = Literal["admin", "user"]
# A bearer token is the whole secret: a short one can be guessed by trying.
MIN_TOKEN_CHARS = 16


class TokenGrant(BaseModel):
    """What one API token may do: its role, and the tenant whose jobs it sees and submits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    tenant: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ApiSettings(CommonSettings):
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    # ``UNICRON_API_TOKENS``: JSON ``{"<token>": {"role": "admin"|"user", "tenant": "<name>"}}``.
    # Empty (the dev default) leaves every call open, so the API then binds loopback only.
    # repr=False: the tokens are secrets and settings objects end up in logs and tracebacks.
    api_tokens: dict[str, TokenGrant] = Field(default_factory=dict, repr=False)
    # A non-loopback bind without tokens exposes job control to the network; the operator must
    # say so explicitly.
    api_allow_unauthenticated_bind: bool = False
    # Proxies and load balancers drop idle connections after 30-60 s; a ping every 15 s keeps
    # an SSE stream open and lets the server notice clients that went away.
    api_sse_ping_s: float = 15.0
    # How long the lifespan retries NATS and Redis before the service gives up starting.
    api_connect_timeout_s: float = 30.0
    # The highest weight a "user" token may give a job: weight buys a share of the cluster
    # (docs/design.md §4), so one tenant must not outbid the rest. Admins are bounded by the spec.
    api_user_max_weight: float = Field(10.0, gt=0, le=1e6, allow_inf_nan=False)
    # UNICRON_EVENTS keeps events this long and this many bytes at most (0: no limit); the API
    # sets them on the stream at each start, and nothing else changes them
    # (shared/bus/streamsetup.py).
    events_max_age_s: float = Field(7 * 86400.0, ge=0, le=10 * 365 * 86400, allow_inf_nan=False)
    events_max_bytes: int = Field(1 << 30, ge=0)
    # /metrics shows a finished job's unicron_job_state this long after it ended, so an alert
    # on it (UnicronJobFailed) fires, and the series stay bounded by the live jobs and the
    # recent ones (services/api/state_metrics.py). 0: unfinished jobs only.
    metrics_ended_jobs_s: float = Field(3600.0, ge=0, le=7 * 86400, allow_inf_nan=False)
    # Webhooks (webhook_delivery.py): a failed POST is retried after a back-off drawn below
    # base * 2**n seconds, at most cap, until give-up time or attempts, then dead-lettered. The
    # defaults ride out a receiver away for minutes and notice its return within seconds.
    webhook_retry_base_s: float = Field(0.5, gt=0, le=60, allow_inf_nan=False)
    webhook_retry_cap_s: float = Field(5.0, gt=0, le=3600, allow_inf_nan=False)
    webhook_give_up_s: float = Field(600.0, gt=0, le=7 * 86400, allow_inf_nan=False)
    webhook_max_attempts: int = Field(1000, ge=1)
    webhook_timeout_s: float = Field(10.0, gt=0, le=300, allow_inf_nan=False)
    # Each replica reads every webhook from Redis this often and starts or stops delivering to
    # match (webhook_sync.py): the bound on how long a lost change notice goes unnoticed.
    webhook_reconcile_s: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False)
    # The most webhooks one tenant's user tokens may have: each is a consumer on the event
    # stream and a delivery task in every replica. Admins' webhooks are not counted.
    webhooks_per_tenant: int = Field(20, ge=0, le=10_000)

    @field_validator("api_tokens")
    @classmethod
    def _usable_tokens(cls, tokens: dict[str, TokenGrant]) -> dict[str, TokenGrant]:
        for n, token in enumerate(tokens, start=1):  # by position: never echo a secret
            if len(token) < MIN_TOKEN_CHARS:
                raise ValueError(f"token #{n} is shorter than {MIN_TOKEN_CHARS} characters")
            if not (token.isascii() and token.isprintable()) or " " in token:
                raise ValueError(f"token #{n} must be printable ASCII without spaces")
        return tokens

    @property
    def tokens_required(self) -> bool:
        return bool(self.api_tokens)

    @property
    def loopback_only(self) -> bool:
        if self.api_host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.api_host).is_loopback
        except ValueError:  # a host name other than localhost may resolve anywhere
            return False
