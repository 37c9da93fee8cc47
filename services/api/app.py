"""The FastAPI application: lifespan (NATS and Redis), routers, error shapes, metrics.

``create_app`` builds an independent app from settings, so the service entry point and the
tests construct it the same way and several can live in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from unicron.services.api import unavailable
from unicron.services.api.access import authenticate
from unicron.services.api.metrics import ApiMetrics, MetricsMiddleware
from unicron.services.api.routes import (
    calibration,
    events,
    faults,
    health,
    jobs,
    logs,
    nodes,
    packages,
    plans,
)
from unicron.services.api.settings import ApiSettings
from unicron.shared.bus import Bus
from unicron.shared.logging import get_logger
from unicron.shared.state import StateStore

log = get_logger(component="api")
CLOSE_TIMEOUT_S = 5.0
# Every /v1 router: each of its calls needs a token once tokens are configured. Mount a new
# /v1 resource here, never with include_router on its own (a test checks every /v1 route).
V1_ROUTERS = (jobs, packages, faults, logs, nodes, plans, calibration, events)


def _lifespan(settings: ApiSettings) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        timeout = settings.api_connect_timeout_s
        bus = await Bus.connect(settings.nats_url, "unicron/api", connect_timeout_s=timeout)
        store = await StateStore.connect(settings.redis_url, connect_timeout_s=timeout)
        app.state.bus, app.state.store = bus, store
        log.info("api connected", nats=settings.nats_url, redis=settings.redis_url)
        try:
            yield
        finally:
            # Draining NATS waits on a server that may be gone; shutdown must not hang on it.
            for close in (bus.close, store.close):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(close(), CLOSE_TIMEOUT_S)

    return lifespan


def _readable(error: dict[str, Any]) -> dict[str, Any]:
    """One validation error as ``{loc, msg, type}``, with the message a user can act on."""
    msg = str(error.get("msg", ""))
    ctx = error.get("ctx") or {}
    if error.get("type") == "value_error":  # a model-level check: its text names the fields
        msg = msg.removeprefix("Value error, ")
    elif error.get("type") == "json_invalid" and "error" in ctx:
        msg = f"{msg}: {ctx['error']}"
    return {"loc": list(error.get("loc", ())), "msg": msg, "type": error.get("type")}


def _summary(error: dict[str, Any]) -> str:
    """``field.path: message``; a model-level message names its fields itself."""
    path = ".".join(str(part) for part in error["loc"] if part != "body")
    return f"{path}: {error['msg']}" if path else str(error["msg"])


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    detail = [_readable(dict(e)) for e in exc.errors()]
    message = "; ".join(_summary(d) for d in detail)
    return JSONResponse({"detail": detail, "message": message}, status_code=422)


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    app = FastAPI(
        title="Unicron API",
        version="0.1.0",
        summary="Submit and control training jobs, watch the cluster and its event stream.",
        lifespan=_lifespan(settings),
    )
    app.state.settings = settings
    app.state.metrics = ApiMetrics()
    for module in V1_ROUTERS:
        app.include_router(module.router, dependencies=[Depends(authenticate)])
    app.include_router(health.router)  # probes and scrapers carry no token
    app.add_exception_handler(RequestValidationError, _validation_error)
    unavailable.install(app)  # Redis or NATS away: 503 + Retry-After, not 500
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app
