"""A real API server for the tests: uvicorn in a thread, on a free port, with its lifespan."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI
from unicron.services.api.app import create_app
from unicron.services.api.settings import ApiSettings
from unicron.shared.procs import free_port

STARTUP_TIMEOUT_S = 15.0
T = TypeVar("T")


@contextmanager
def serve_api(nats_url: str, redis_url: str, **settings: Any) -> Iterator[str]:
    """Serve the API until the block ends; yields its base URL."""
    with serve_app(nats_url, redis_url, **settings) as (url, _):
        yield url


@contextmanager
def serve_app(nats_url: str, redis_url: str, **settings: Any) -> Iterator[tuple[str, FastAPI]]:
    """:func:`serve_api`, yielding the app too: a test may look at what its lifespan holds."""
    port = free_port()
    api_settings = ApiSettings(
        nats_url=nats_url,
        redis_url=redis_url,
        api_port=port,
        api_connect_timeout_s=5.0,
        **settings,
    )
    app = create_app(api_settings)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"api-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the API server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=10)


async def eventually(probe: Callable[[], Awaitable[T]], timeout_s: float = 10.0) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while True:
            if result := await probe():
                return result
            await asyncio.sleep(0.02)
