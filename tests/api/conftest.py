"""Each API test gets a real API server over its own NATS and Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.api.factories import TOKENS
from tests.api.live import serve_api


@pytest.fixture
def api_url(nats_url: str, redis_url: str) -> Iterator[str]:
    with serve_api(nats_url, redis_url, api_sse_ping_s=0.2) as url:
        yield url


@pytest.fixture
async def client(api_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api_url, timeout=10.0) as http:
        yield http


@pytest.fixture
async def secured(nats_url: str, redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an API that asks for a bearer token (those of tests.api.factories)."""
    with serve_api(nats_url, redis_url, api_tokens=TOKENS) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as http:
            yield http
