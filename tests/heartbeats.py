"""Nodes that stay fresh while a test runs: their heartbeats, written by a background task."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

from unicron.shared.contracts.models import NodeRecord, now
from unicron.shared.store.api import JobStore


def _beat(node: NodeRecord) -> None:
    node.last_heartbeat = now()


@contextlib.asynccontextmanager
async def beating(state: JobStore, node_ids: Iterable[str], every_s: float) -> AsyncIterator[None]:
    """Heartbeat each of ``node_ids`` every ``every_s`` while inside; ``node_ids`` is read
    again each round, so a collection the test grows is followed."""

    async def heartbeats() -> None:
        while True:
            for node_id in list(node_ids):
                await state.update_node(node_id, _beat)
            await asyncio.sleep(every_s)

    task = asyncio.create_task(heartbeats())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
