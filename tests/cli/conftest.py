"""Each CLI test runs commands against a real API server over its own NATS and Redis."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import structlog

from tests.api.live import serve_api


@pytest.fixture(autouse=True)
def server_logs_apart_from_cli_output() -> Iterator[None]:
    """The API runs in this process; its logs must not land in the output CliRunner captures."""
    saved = structlog.get_config()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    yield
    structlog.configure(**saved)


@pytest.fixture
def api_url(nats_url: str, redis_url: str) -> Iterator[str]:
    with serve_api(nats_url, redis_url) as url:
        yield url
