"""The API's event stream (``GET /v1/events``) as CloudEvents, resumed where it broke.

The stream's SSE ids are JetStream sequence numbers. When a connection drops (a restart of the
API, a proxy's idle cut, a read timeout), :func:`event_stream` connects again with
``Last-Event-ID`` set to the last sequence it yielded, so nothing is lost or repeated, and keeps
trying for ``resume_for_s`` before it gives up. The first connection is not retried: an API
that cannot be reached at all is the caller's to hear about at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from unicron.errors import ApiUnreachable, Unavailable, raise_for, unreachable
from unicron.shared.contracts.events import CloudEvent

# A followed stream carries a ping every 15 s (UNICRON_API_SSE_PING_S); four missed pings mean
# the connection is gone.
STREAM_READ_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 10.0
FIRST_RETRY_S = 0.1
LAST_RETRY_S = 2.0
# What the generator yields: each event with its sequence, and ``CONNECTED`` whenever a
# connection (the first or a resumed one) is open, so a caller can read state it may have
# missed meanwhile.
CONNECTED = None
StreamItem = tuple[int, CloudEvent] | None


@dataclass(frozen=True)
class EventQuery:
    """Which events: ``types`` (none: all), about ``job`` (None: any), after sequence ``since``
    (None: only new ones when following, all stored ones otherwise), and whether to follow."""

    types: Sequence[str] = ()
    job: str | None = None
    since: int | None = None
    follow: bool = True

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"follow": str(self.follow).lower(), "type": list(self.types)}
        if self.job is not None:
            params["job"] = self.job
        if self.since is not None:
            params["since"] = self.since
        return params


@dataclass
class _Resume:
    """Where to resume, and since when the stream has been broken."""

    last: int | None
    broken_at: float | None = None
    retry_s: float = FIRST_RETRY_S

    def headers(self) -> dict[str, str]:
        return {} if self.last is None else {"Last-Event-ID": str(self.last)}

    def connected(self) -> None:
        self.broken_at, self.retry_s = None, FIRST_RETRY_S

    async def broke(self, why: Exception, resume_for_s: float, base_url: str) -> None:
        """Wait before the next attempt; raise once the stream has been broken too long."""
        now = time.monotonic()
        self.broken_at = self.broken_at or now
        if now - self.broken_at >= resume_for_s:
            after = "" if self.last is None else f" after #{self.last}"
            raise ApiUnreachable(
                f"the event stream of {base_url} broke{after} and did not come back within "
                f"{resume_for_s:g} s: {why}"
            ) from why
        await asyncio.sleep(self.retry_s)
        self.retry_s = min(self.retry_s * 2, LAST_RETRY_S)


async def event_stream(
    http: httpx.AsyncClient, query: EventQuery, resume_for_s: float
) -> AsyncGenerator[StreamItem, None]:
    """``CONNECTED`` on every (re)connection, then ``(sequence, event)`` as they come; without
    ``follow`` it ends after the events stored when it started."""
    resume = _Resume(last=query.since)
    timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
    params, ever_connected = query.params(), False
    while True:
        try:
            async with aconnect_sse(
                http, "GET", "/v1/events", params=params, headers=resume.headers(), timeout=timeout
            ) as source:
                if source.response.is_error:
                    await source.response.aread()
                    raise_for(source.response)
                ever_connected = True
                resume.connected()
                yield CONNECTED
                async for message in source.aiter_sse():
                    if (
                        not message.data
                    ):  # a keep-alive: httpx-sse hands out the blank line after one
                        continue
                    resume.last = int(message.id)
                    yield resume.last, CloudEvent.model_validate_json(message.data)
            if not query.follow:
                return
            why: Exception = ApiUnreachable("the API closed the stream")  # say, a restart
        except (httpx.TransportError, Unavailable) as exc:
            if not ever_connected:
                if isinstance(exc, httpx.TransportError):
                    raise unreachable(str(http.base_url), exc) from exc
                raise
            why = exc
        await resume.broke(why, resume_for_s, str(http.base_url).rstrip("/"))
