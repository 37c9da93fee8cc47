"""503 with a reason and Retry-After, instead of a 500, while Redis or NATS is away.

A route needs no code of its own for it: the client errors that mean "server unreachable" are
mapped here once, and a client retries after the header's seconds.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse
from unicron.shared.logging import get_logger
from unicron.shared.outage import BUS_ERRORS, STORE_ERRORS, describe

log = get_logger(component="api")
RETRY_AFTER_S = 2
LOG_EVERY_S = 10.0


class _Quiet:
    """At most one warning per dependency every ``LOG_EVERY_S``, however many requests fail:
    the API has no loop of its own that could notice the end of an outage."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        self.failed: dict[str, int] = {}

    def note(self, what: str, exc: Exception) -> None:
        self.failed[what] = self.failed.get(what, 0) + 1
        at = time.monotonic()
        if at - self.last.get(what, -LOG_EVERY_S) >= LOG_EVERY_S:
            self.last[what] = at
            log.warning(f"{what} unavailable; answering 503", error=describe(exc))


def _unavailable(what: str, exc: Exception, request: Request) -> JSONResponse:
    request.app.state.unavailable.note(what, exc)
    detail = f"{what} unavailable: {describe(exc)}"
    return JSONResponse(
        {"detail": detail},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def _store_error(request: Request, exc: Exception) -> JSONResponse:
    return _unavailable("state store", exc, request)


async def _bus_error(request: Request, exc: Exception) -> JSONResponse:
    return _unavailable("event bus", exc, request)


def install(app: FastAPI) -> None:
    app.state.unavailable = _Quiet()
    for error in STORE_ERRORS:
        app.add_exception_handler(error, _store_error)
    for error in BUS_ERRORS:
        app.add_exception_handler(error, _bus_error)
