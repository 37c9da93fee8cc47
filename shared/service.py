"""Run loop shared by every service: logging, connections, and a clean stop on SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.roles import CredentialsError
from unicron.shared.logging import configure_logging, get_logger
from unicron.shared.metrics import serve_metrics
from unicron.shared.settings import CommonSettings
from unicron.shared.store.redisauth import check_login, redacted
from unicron.shared.store.state import StateStore

S = TypeVar("S", bound=CommonSettings)
ServiceBody = Callable[[Bus, StateStore, asyncio.Event], Awaitable[None]]


async def serve(name: str, settings: CommonSettings, body: ServiceBody) -> None:
    """Connect to NATS and Redis, serve the bus's metrics (``UNICRON_METRICS_PORT``), run
    ``body`` until a stop signal, then close them all."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log = get_logger()
    try:
        # Side by side: a restarted service is back on the path of a recovery a round trip
        # sooner (docs/design.md §6).
        bus, state = await asyncio.gather(
            Bus.connect(
                settings.nats_url,
                f"unicron/{name}",
                access=settings.nats_access,
                replicas=settings.replicas_asked,
            ),
            _connect_state(settings),
        )
    except CredentialsError as exc:  # retrying cannot help: say what to fix, and exit
        log.error("credentials refused", error=str(exc))
        raise SystemExit(2) from None
    log.info("service started", nats=settings.nats_url, redis=redacted(settings.redis_url))
    scraped = serve_metrics(bus.metrics, settings.metrics_host, settings.metrics_port)
    try:
        await body(bus, state, stop)
    finally:
        if scraped is not None:
            scraped.close()
        await bus.close()
        await state.close()
        log.info("service stopped")


async def _connect_state(settings: CommonSettings) -> StateStore:
    await check_login(settings.redis_url)
    return await StateStore.connect(
        settings.redis_url,
        job_retention_s=settings.job_retention_s,
        sentinel=settings.redis_sentinel,
    )


def run_service(name: str, settings: CommonSettings, body: ServiceBody) -> None:
    configure_logging(name, settings.log_level, settings.log_format)
    asyncio.run(serve(name, settings, body))


def service_main(
    name: str,
    settings: S,
    run: Callable[[Bus, StateStore, asyncio.Event, S], Awaitable[None]],
) -> None:
    """Entry point of ``python -m services.<name>`` for a ``run(bus, state, stop, settings)``."""

    async def body(bus: Bus, state: StateStore, stop: asyncio.Event) -> None:
        await run(bus, state, stop, settings)

    run_service(name, settings, body)
