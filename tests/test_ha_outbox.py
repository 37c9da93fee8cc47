"""An agent's outbox while the stream it stores into elects a leader: every message queued
meanwhile reaches the consumer at once by the fast lane, in order, and once."""

from __future__ import annotations

import asyncio

from unicron.services.agent.outbox import Outbox
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.bus.streams import ALL_EVENTS
from unicron.shared.contracts.events import JobStateChanged
from unicron.shared.contracts.lifecycle import JobState
from unicron.shared.servers.embedded import EmbeddedServer

from tests.test_ha_nats import beside_events_leader, cluster, lane_open

__all__ = ["cluster"]  # the fixture


def changed(index: int) -> JobStateChanged:
    return JobStateChanged(
        job_id=f"job-{index}", old=JobState.PENDING, new=JobState.STARTING, reason="outbox"
    )


async def test_messages_queued_behind_a_stalled_store_come_by_the_lane_in_order(
    cluster: list[EmbeddedServer],
) -> None:
    victim, others = await beside_events_leader(cluster)
    consumer = await Bus.connect(others, "unicron/test-consumer", 20, replicas=3)
    agent_bus = await Bus.connect(others, "unicron/agent", 20, replicas=3)
    outbox = Outbox(agent_bus)
    handled: asyncio.Queue[str] = asyncio.Queue()
    warm_seen = asyncio.Event()

    async def on_event(raw: bytes) -> None:
        event = parse_event(raw)
        if event.id == "evt-warm":
            warm_seen.set()
        else:
            await handled.put(event.data["job_id"])

    try:
        await consumer.consume(ALL_EVENTS, "outbox-events", bytes, on_event)
        await lane_open(agent_bus, warm_seen)
        outbox.start()
        victim.process.kill()
        for index in range(3):
            outbox.event(changed(index))
        got = [await asyncio.wait_for(handled.get(), 30) for _ in range(3)]
        assert got == ["job-0", "job-1", "job-2"]
        assert outbox.pending > 0  # they came before the stream could store them
        await outbox.drained(30)
        outbox.event(changed(3))
        # next is job-3: the stored copies of the first three were skipped
        assert await asyncio.wait_for(handled.get(), 30) == "job-3"
    finally:
        await outbox.close()
        await agent_bus.close()
        await consumer.close()
