"""A whole stack on servers of its own, for a test module that shares one (a module-scoped
fixture): the per-test NATS and Redis of ``tests/conftest.py`` would outlive none of its tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from unicron.cli.stack import Stack, StackConfig
from unicron.shared.procs import free_port
from unicron.shared.servers.embedded import start_nats, start_redis


@contextlib.contextmanager
def stack_on_own_servers(root: Path, **config: Any) -> Iterator[Stack]:
    """A started :class:`Stack` under ``root``, on a NATS and a Redis started for it; ``config``
    is the rest of its :class:`StackConfig`."""
    nats, redis = start_nats(root / "nats"), start_redis(root / "redis")
    settings = StackConfig(
        nats_url=nats.url, redis_url=redis.url, api_port=free_port(), data_dir=root / "stack",
        **config,
    )  # fmt: skip
    try:
        with Stack(settings) as running:
            yield running
    finally:
        nats.stop()
        redis.stop()
