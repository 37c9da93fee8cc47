"""Quiet back-off for loops whose NATS or Redis went away.

A loop that retries on every error logs one warning when an outage starts and one info line
when it ends, and waits longer between attempts while it lasts, instead of a traceback per
attempt. Errors that are not an outage (a bug) still get their traceback, rate-limited by the
same back-off so a bug cannot flood the log either.

The back-off stops growing at half a second: a control-plane loop is on the path of a
recovery, and however long the server was away it must notice its return at once (a 5-s cap
made a plan wait 2.2 s after a 1.6-s Redis restart). The loops that use it are a handful per
service, not one per worker, so two attempts a second are no load on a recovering server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
import redis.exceptions
from unicron.shared.logging import get_logger

T = TypeVar("T")

# What a client raises while its server is down or unreachable; a JetStream request times out
# or finds no responder while the server restarts, and a stream that lost its leader with a
# clustered server answers 503 (no response from the stream) until the others elected one.
STORE_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
)
BUS_ERRORS: tuple[type[Exception], ...] = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoServersError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    *STORE_ERRORS,
    *BUS_ERRORS,
    ConnectionError,
    TimeoutError,
)


def describe(exc: BaseException) -> str:
    """``Type: message``: redis-py's repr() drops the message that names the address."""
    return f"{type(exc).__name__}: {exc}"[:300]


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says a server is away rather than that the code is wrong."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_outage(e) for e in exc.exceptions)
    return isinstance(exc, OUTAGE_ERRORS)


class Outage:
    """Tracks one loop's outage: ``failed`` on each error, ``ok`` after each success."""

    def __init__(self, what: str, base_s: float = 0.1, cap_s: float = 0.5, **context: Any):
        self.what = what
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0  # consecutive, since the last success
        self.outages = 0  # how many started, for tests and metrics
        self.errors_logged = 0
        self._since = 0.0
        self._warned = False
        self._log = get_logger(**context)

    @property
    def down(self) -> bool:
        return self.failures > 0

    def failed(self, exc: BaseException) -> float:
        """Record a failed attempt; returns how long to wait before the next one."""
        if not self.down:
            self._since = time.monotonic()
        self.failures += 1
        if not is_outage(exc):
            self.errors_logged += 1
            self._log.error(f"{self.what} failed; retrying", failures=self.failures, exc_info=exc)
        elif not self._warned:
            self._warned = True
            self.outages += 1
            self._log.warning(f"{self.what}: server unavailable; backing off", error=describe(exc))
        return self.delay()

    def delay(self) -> float:
        if not self.down:
            return 0.0
        return min(self.cap_s, self.base_s * 2.0 ** (self.failures - 1))

    def ok(self) -> None:
        """Record a success; ends an outage with one line saying how long it lasted."""
        if self._warned:
            self._log.info(
                f"{self.what}: recovered",
                down_s=round(time.monotonic() - self._since, 2),
                failures=self.failures,
            )
        self.failures = 0
        self._warned = False

    async def pause(self, stop: asyncio.Event | None = None) -> None:
        """Sleep the current back-off, or until ``stop`` is set."""
        wait = self.delay()
        if wait <= 0:
            return
        if stop is None:
            await asyncio.sleep(wait)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)

    async def through(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt`` until it succeeds, waiting out outages with back-off; any other error
        is raised at once."""
        while True:
            try:
                result = await attempt()
            except Exception as exc:
                if not is_outage(exc):
                    raise
                self.failed(exc)
                await self.pause()
                continue
            self.ok()
            return result
