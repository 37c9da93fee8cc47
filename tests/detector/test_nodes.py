"""Node loss from heartbeats: declared when the node's silence passes the timeout, not at the
next polling tick, and never for silence the detector could not have heard (Redis away, the
detector itself down)."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from unicron.services.detector.correlate import Correlator
from unicron.services.detector.nodes import NodeMonitor
from unicron.services.detector.settings import DetectorSettings
from unicron.services.detector.signals import Candidate
from unicron.services.detector.suspicion import Suspicion
from unicron.shared.bus.api import EventBus
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import NodeRecord, NodeState, now
from unicron.shared.servers.embedded import EmbeddedServer
from unicron.shared.store.api import JobStore
from unicron.shared.store.hearing import Hearing
from unicron.shared.store.state import StateStore

from tests.detector.conftest import Cluster, next_event

HEARTBEAT_S = 0.2  # x 3 misses: silent for more than 0.6 s is lost


@pytest.fixture
def detector_settings(nats_url: str, redis_url: str) -> DetectorSettings:
    # Polling only once a second: a loss seen within a fraction of that came from a check
    # scheduled at the node's own deadline.
    return DetectorSettings(
        nats_url=nats_url,
        redis_url=redis_url,
        heartbeat_interval_s=HEARTBEAT_S,
        node_check_interval_s=1.0,
    )


async def test_a_silent_node_is_lost_at_its_deadline(
    cluster: Cluster, events: asyncio.Queue[CloudEvent], detector_settings: DetectorSettings
) -> None:
    await cluster.add_node("node-0")
    await asyncio.sleep(3 * HEARTBEAT_S)  # a few heartbeats in
    cluster.kill_agent("node-0")
    lost = await next_event(events, "node.lost", timeout_s=5.0)
    silent_s = time.time() - lost.data["last_heartbeat"]
    timeout_s = detector_settings.node_timeout_s
    assert lost.data["node_id"] == "node-0"
    assert timeout_s < silent_s < timeout_s + 0.4, silent_s  # a 1-s tick could add up to 1 s


async def test_a_silent_quarantined_node_fails_its_workers_and_stays_quarantined(
    cluster: Cluster, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    for node_id in ("node-0", "node-1"):
        await cluster.add_node(node_id)
    await cluster.add_job("job-q", ["node-0", "node-1"])

    def quarantine(node: NodeRecord) -> None:
        node.state, node.quarantined_until = NodeState.QUARANTINED, now() + 600

    await state.update_node("node-1", quarantine)
    cluster.kill_agent("node-1")
    failure = (await next_event(events, "failure.detected", timeout_s=5.0)).data
    assert (failure["kind"], failure["node_id"], failure["rank"]) == ("node_lost", "node-1", 1)
    node = await state.get_node("node-1")
    assert node is not None and node.state == NodeState.QUARANTINED


async def test_silence_while_redis_was_away_is_no_nodes_fault(
    bus: Bus, redis_server: EmbeddedServer, redis_url: str
) -> None:
    state = await StateStore.connect(redis_url)
    hearing = Hearing(timeout_s=0.6)
    monitor = _monitor(bus, state, hearing)
    await state.put_node(NodeRecord(id="node-0", slots=2, last_heartbeat=now()))
    assert await monitor.check() == []
    await asyncio.to_thread(redis_server.stop)
    with pytest.raises(RedisConnectionError):
        await monitor.check()
    await asyncio.sleep(1.0)  # an outage longer than the node timeout: no beat can land
    await asyncio.to_thread(redis_server.restart)  # with its data: the record's beat is old
    assert await monitor.check() == []
    node = await state.get_node("node-0")
    assert node is not None and node.state == NodeState.READY
    # Heard from since the outage ended: from now on its silence counts.
    await asyncio.sleep(0.7)
    assert await monitor.check() == ["node-0"]
    await state.close()


async def test_a_restarted_detector_counts_silence_from_its_start(
    bus: Bus, state: StateStore
) -> None:
    await state.put_node(NodeRecord(id="node-1", slots=2, last_heartbeat=now() - 60))
    monitor = _monitor(bus, state, Hearing(timeout_s=0.6))
    assert await monitor.check() == []  # it could not have heard the minute before it started
    await asyncio.sleep(0.7)
    assert await monitor.check() == ["node-1"]


async def _ignore(_: Candidate) -> bool:
    return True


def _monitor(bus: EventBus, state: JobStore, hearing: Hearing) -> NodeMonitor:
    settings = DetectorSettings(heartbeat_interval_s=hearing.timeout_s / 3)
    suspicion = Suspicion(bus, settings)
    return NodeMonitor(bus, state, Correlator(0.05, _ignore), hearing, suspicion)


class CountingReads:
    """A store that counts the node records read through it."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.records_read = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def get_node(self, node_id: str) -> NodeRecord | None:
        self.records_read += 1
        return await self.store.get_node(node_id)

    async def list_nodes(self) -> list[NodeRecord]:
        nodes = await self.store.list_nodes()
        self.records_read += len(nodes)
        return nodes


async def test_a_check_reads_the_silent_nodes_only(bus: Bus, state: StateStore) -> None:
    """Checked ten times a second, a scan of 2,048 node records would cost the detector half a
    core (bench/scale.py): the heartbeat index names the silent ones."""
    for index in range(40):
        await state.put_node(NodeRecord(id=f"node-{index}", slots=8, last_heartbeat=now()))
    await state.put_node(NodeRecord(id="node-silent", slots=8, last_heartbeat=now() - 60))
    reads = CountingReads(state)
    hearing = Hearing(timeout_s=0.6)
    hearing.since = now() - 60  # it has been listening all along
    monitor = _monitor(bus, cast(JobStore, reads), hearing)
    assert await monitor.check() == ["node-silent"]
    assert reads.records_read <= 2  # the silent one, read and written lost
    assert await monitor.check() == []  # judged once per silence
    assert reads.records_read <= 2
    # when the first fresh node becomes a suspect, to be asked after
    suspect_after = monitor.suspect_after_s
    assert now() + suspect_after - 0.1 < monitor.next_due <= now() + suspect_after
