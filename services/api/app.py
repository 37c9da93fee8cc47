"""The FastAPI application: lifespan (NATS and Redis), routers, error shapes, metrics.

``create_app`` builds an independent app from settings, so the service entry point and the
tests construct it the same way and several can live in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from unicron.services.api import errors, unavailable
from unicron.services.api.access import authenticate
from unicron.services.api.metrics import ApiMetrics, MetricsMiddleware
from unicron.services.api.openapi import operation_id
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
    ui,
    webhooks,
)
from unicron.services.api.settings import ApiSettings
from unicron.services.api.webhook_delivery import WebhookDeliverer
from unicron.services.api.webhook_sync import WebhookSync
from unicron.shared.bus.bus import Bus
from unicron.shared.bus.streams import EVENTS_STREAM
from unicron.shared.bus.streamsetup import StreamLimits, apply_limits
from unicron.shared.logging import get_logger
from unicron.shared.store.redisauth import check_login, redacted
from unicron.shared.store.state import StateStore
from unicron.shared.store.webhooks import WebhookStore

log = get_logger(component="api")
CLOSE_TIMEOUT_S = 5.0
# Every /v1 router: each of its calls needs a token once tokens are configured. Mount a new
# /v1 resource here, never with include_router on its own (a test checks every /v1 route).
V1_ROUTERS = (jobs, packages, faults, logs, nodes, plans, calibration, events, webhooks)


def _lifespan(settings: ApiSettings) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        timeout = settings.api_connect_timeout_s
        bus = await Bus.connect(
            settings.nats_url,
            "unicron/api",
            timeout,
            access=settings.nats_access,
            replicas=settings.replicas_asked,
        )
        await check_login(settings.redis_url)
        store = await StateStore.connect(
            settings.redis_url,
            connect_timeout_s=timeout,
            job_retention_s=settings.job_retention_s,
            sentinel=settings.redis_sentinel,
        )
        app.state.bus, app.state.store = bus, store
        limits = StreamLimits(settings.events_max_age_s, settings.events_max_bytes)
        await apply_limits(bus.js, EVENTS_STREAM, limits)
        webhooks = app.state.webhook_store = WebhookStore(store.redis)
        deliverer = WebhookDeliverer(bus, store, webhooks, settings)
        sync = WebhookSync(bus, webhooks, deliverer, settings.webhook_reconcile_s)
        app.state.webhook_deliverer, app.state.webhook_sync = deliverer, sync
        await sync.start()  # every stored webhook delivered again: their consumers kept their place
        log.info("api connected", nats=settings.nats_url, redis=redacted(settings.redis_url))
        try:
            yield
        finally:
            # Draining NATS waits on a server that may be gone; shutdown must not hang on it.
            for close in (sync.close, deliverer.close, bus.close, store.close):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(close(), CLOSE_TIMEOUT_S)

    return lifespan


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    app = FastAPI(
        title="Unicron API",
        version="0.1.0",
        summary="Submit and control training jobs, watch the cluster and its event stream.",
        lifespan=_lifespan(settings),
        generate_unique_id_function=operation_id,
    )
    app.state.settings = settings
    app.state.metrics = ApiMetrics(settings.metrics_ended_jobs_s)
    for module in V1_ROUTERS:
        app.include_router(
            module.router, dependencies=[Depends(authenticate)], responses=errors.errors(401, 503)
        )
    app.include_router(health.router)  # probes and scrapers carry no token
    app.include_router(ui.router)  # the page is public; the /v1 data it reads is not
    app.add_exception_handler(RequestValidationError, errors.validation_error)
    app.add_exception_handler(StarletteHTTPException, errors.http_error)
    unavailable.install(app)  # Redis or NATS away: 503 + Retry-After, not 500
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app
