"""Real servers for the tests: each test gets its own nats-server -js and redis-server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from unicron.shared.bus.bus import Bus
from unicron.shared.servers.embedded import EmbeddedServer, start_nats, start_redis
from unicron.shared.store.state import StateStore


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    server = start_nats(tmp_path / "nats")
    yield server
    server.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    server = start_redis(tmp_path / "redis")
    yield server
    server.stop()


@pytest.fixture
def nats_url(nats_server: EmbeddedServer) -> str:
    return nats_server.url


@pytest.fixture
def redis_url(redis_server: EmbeddedServer) -> str:
    return redis_server.url


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    connected = await Bus.connect(nats_url, source="unicron/test")
    yield connected
    await connected.close()


@pytest.fixture
async def state(redis_url: str) -> AsyncIterator[StateStore]:
    store = await StateStore.connect(redis_url)
    yield store
    await store.close()
