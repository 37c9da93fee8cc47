"""Redis state access against a real server: optimistic updates stay cancellable."""

from __future__ import annotations

import asyncio
import random

from unicron.shared.contracts.models import NodeRecord, now
from unicron.shared.store.state import StateStore


async def test_a_cancelled_update_loop_stops_wherever_the_cancel_lands(state: StateStore) -> None:
    # A heartbeat-like loop of optimistic updates, cancelled at random moments: redis-py's
    # pipeline cleanup may swallow the cancel, and the store must re-raise it, or a service's
    # shutdown waits on such a task forever.
    await state.put_node(NodeRecord(id="node-0", slots=1))

    def beat(node: NodeRecord) -> None:
        node.last_heartbeat = now()

    async def beating() -> None:
        while True:
            await state.update_node("node-0", beat)
            await asyncio.sleep(0)

    noise = random.Random(3)
    for _ in range(40):
        task = asyncio.create_task(beating())
        await asyncio.sleep(noise.random() * 0.01)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=2.0)
        assert task in done, "a cancelled update loop kept running"
        assert task.cancelled()


async def test_the_nodes_of_a_wide_job_are_read_at_once_past_the_clients_pool(
    state: StateStore,
) -> None:
    """The records of more nodes than the client has connections (100): one read, the missing
    ones left out. A GET each, gathered, ran out of connections at 2,048 nodes and cost the
    executor its lease."""
    wanted = [f"wide-{i}" for i in range(250)]
    for node_id in wanted[:249]:
        await state.put_node(NodeRecord(id=node_id, slots=8))
    found = await state.get_nodes([*wanted, *wanted])
    assert [n.id for n in found] == sorted(wanted[:249])
    assert await state.get_nodes([]) == []
