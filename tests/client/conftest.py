"""Each client test talks to a real API server over its own NATS and Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api.factories import TOKENS
from tests.api.live import serve_api


@pytest.fixture
def api_url(nats_url: str, redis_url: str) -> Iterator[str]:
    with serve_api(nats_url, redis_url, api_sse_ping_s=0.2) as url:
        yield url


@pytest.fixture
def secured_url(nats_url: str, redis_url: str) -> Iterator[str]:
    """An API that asks for the bearer tokens of tests.api.factories."""
    with serve_api(nats_url, redis_url, api_tokens=TOKENS) as url:
        yield url
