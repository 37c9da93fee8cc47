"""A 3-server NATS cluster with the streams on all three: losing a server loses no message.

Events, commands and reports are published without pause while one server, the leader of the
events stream and the publisher's own server, is SIGKILLed. Every message JetStream
acknowledged must reach the durable consumer of its stream; the publisher and the consumers
move to the remaining servers by themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from unicron.shared.addresses import ServerListError, nats_servers
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.bus.streams import (
    ALL_COMMANDS,
    ALL_EVENTS,
    ALL_REPORTS,
    EVENTS_STREAM,
    STREAMS,
)
from unicron.shared.bus.streamsetup import StreamReplicasError
from unicron.shared.contracts.events import CloudEvent, JobStateChanged, event_subject
from unicron.shared.contracts.lifecycle import JobState
from unicron.shared.contracts.messages import StopWorkers
from unicron.shared.contracts.reports import StepCompleted
from unicron.shared.outage import is_outage
from unicron.shared.servers.embedded import EmbeddedServer
from unicron.shared.servers.natscluster import cluster_url, start_nats_cluster

ROUNDS = 120
KILL_AT = 40


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[EmbeddedServer]]:
    servers = start_nats_cluster(tmp_path / "nats", size=3)
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
async def consumer(cluster: list[EmbeddedServer]) -> AsyncIterator[Bus]:
    bus = await Bus.connect(cluster_url(cluster), "unicron/test", 20, replicas=3)
    yield bus
    await bus.close()


async def until_acked(publish: Callable[[], Awaitable[object]], timeout_s: float = 30.0) -> None:
    """Publish until JetStream acknowledges, as a service's retry does; the message id makes a
    repeat of a message that was stored after all a no-op."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await publish()
            return
        except Exception as exc:
            if not is_outage(exc) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


async def publish_round(bus: Bus, index: int) -> None:
    event = JobStateChanged(
        job_id=f"job-{index}", old=JobState.PENDING, new=JobState.STARTING, reason="ha"
    )
    await until_acked(lambda: bus.publish_event(event, event_id=f"evt-{index}"))
    command = StopWorkers(command_id=f"cmd-{index}", job_id=f"job-{index}", reason="ha")
    await until_acked(lambda: bus.send_command("node-0", command))
    report = StepCompleted(
        node_id="node-0", job_id="job-0", generation=0, rank=0, step=index, loss=1.0,
        iteration_s=0.1,
    )  # fmt: skip
    await until_acked(lambda: bus.publish_report(report))


class Seen:
    """What the durable consumers received, by stream; ``complete`` once each has it all."""

    def __init__(self) -> None:
        self.ids: dict[str, set[str]] = {"events": set(), "commands": set(), "reports": set()}
        self.complete = asyncio.Event()

    def add(self, kind: str, message_id: str) -> None:
        self.ids[kind].add(message_id)
        if all(len(ids) >= ROUNDS for ids in self.ids.values()):
            self.complete.set()


async def consume_all(bus: Bus) -> Seen:
    """Durable consumers on the three streams."""
    seen = Seen()

    async def on_event(raw: bytes) -> None:
        seen.add("events", parse_event(raw).id)

    async def on_command(raw: bytes) -> None:
        seen.add("commands", StopWorkers.model_validate_json(raw).command_id)

    async def on_report(raw: bytes) -> None:
        seen.add("reports", f"step-{StepCompleted.model_validate_json(raw).step}")

    await bus.consume(ALL_EVENTS, "ha-events", bytes, on_event)
    await bus.consume(ALL_COMMANDS, "ha-commands", bytes, on_command)
    await bus.consume(ALL_REPORTS, "ha-reports", bytes, on_report)
    return seen


async def events_leader(bus: Bus, cluster: list[EmbeddedServer]) -> EmbeddedServer:
    info = await bus.js.stream_info(EVENTS_STREAM)
    assert info.cluster is not None and info.cluster.leader is not None
    return cluster[int(info.cluster.leader.rsplit("-", 1)[1])]


async def test_killing_one_server_loses_no_message(
    cluster: list[EmbeddedServer], consumer: Bus
) -> None:
    seen = await consume_all(consumer)
    victim = await events_leader(consumer, cluster)
    # Only the victim's URL: the client learns the others from the cluster itself.
    publisher = await Bus.connect(victim.url, "unicron/test-publisher", 20, replicas=3)
    started = time.monotonic()
    try:
        for index in range(ROUNDS):
            if index == KILL_AT:
                victim.process.kill()
            await publish_round(publisher, index)
            await asyncio.sleep(0.01)
        assert publisher.connected
        assert publisher.nc.connected_url is not None
        assert publisher.nc.connected_url.port != victim.port
    finally:
        await publisher.close()

    expected = {
        "events": {f"evt-{i}" for i in range(ROUNDS)},
        "commands": {f"cmd-{i}" for i in range(ROUNDS)},
        "reports": {f"step-{i}" for i in range(ROUNDS)},
    }
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(seen.complete.wait(), 30)
    missing = {kind: sorted(expected[kind] - seen.ids[kind])[:5] for kind in expected}
    assert seen.ids == expected, f"lost: {missing}"
    assert time.monotonic() - started < 50


async def test_streams_follow_the_setting_and_keep_their_count_without_one(
    cluster: list[EmbeddedServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("UNICRON_STREAM_REPLICAS", raising=False)
    url = cluster_url(cluster)

    async def replicas(wanted: int | None) -> set[int | None]:
        bus = await Bus.connect(url, "unicron/test", 20, replicas=wanted)
        try:
            return {(await bus.js.stream_info(name)).config.num_replicas for name in STREAMS}
        finally:
            await bus.close()

    assert await replicas(1) == {1}
    assert await replicas(3) == {3}  # a single server's streams, scaled to the cluster
    assert await replicas(None) == {3}  # an operator's bare environment shrinks nothing


async def test_more_replicas_than_servers_names_the_setting(nats_url: str) -> None:
    with pytest.raises(StreamReplicasError, match="UNICRON_STREAM_REPLICAS"):
        await Bus.connect(nats_url, "unicron/test", 10, replicas=3)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "empty"),
        ("http://u:secret@host:1", "'http://host'"),
        ("nats://a:1,tls://b:2", "mixes"),
    ],
)
def test_a_bad_server_list_is_named_without_its_password(url: str, says: str) -> None:
    with pytest.raises(ServerListError, match=says) as raised:
        nats_servers(url)
    assert "secret" not in str(raised.value)
    assert "UNICRON_NATS_URL" in str(raised.value)


async def test_a_service_started_during_a_leader_election_waits_it_out(
    cluster: list[EmbeddedServer], consumer: Bus
) -> None:
    """A consumer created while its stream has no leader (the leader's server was just
    killed) times out for seconds; the service binding it waits, instead of exiting."""
    victim = await events_leader(consumer, cluster)
    others = ",".join(s.url for s in cluster if s is not victim)
    service = await Bus.connect(others, "unicron/test-late", 20, replicas=3)
    got: asyncio.Queue[str] = asyncio.Queue()

    async def on_event(raw: bytes) -> None:
        await got.put(parse_event(raw).id)

    try:
        victim.process.kill()
        await asyncio.wait_for(service.consume(ALL_EVENTS, "late", bytes, on_event), 30)
        await until_acked(lambda: service.publish_event(
            JobStateChanged(job_id="j", old=JobState.PENDING, new=JobState.STARTING, reason="x"),
            event_id="evt-late",
        ))  # fmt: skip
        assert await asyncio.wait_for(got.get(), 15) == "evt-late"
    finally:
        await service.close()


async def beside_events_leader(cluster: list[EmbeddedServer]) -> tuple[EmbeddedServer, str]:
    """The events stream's leader (to kill), and the URL of the other servers (to connect to)."""
    probe = await Bus.connect(cluster_url(cluster), "unicron/test-probe", 20, replicas=3)
    victim = await events_leader(probe, cluster)
    await probe.close()
    return victim, ",".join(s.url for s in cluster if s is not victim)


async def lane_open(publisher: Bus, warm_seen: asyncio.Event) -> None:
    """Until the consumer's interest in the lane has reached the publisher's server (routes
    share it a moment after the subscription): a lane copy sent before then reaches nobody."""
    warm = JobStateChanged(job_id="warm", old=JobState.PENDING, new=JobState.STARTING, reason="")
    payload = CloudEvent.wrap(warm, "unicron/test", "evt-warm").model_dump_json().encode()
    for attempt in range(100):
        await publisher.publisher.lane(event_subject(warm.TYPE), payload, f"evt-warm-{attempt}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(warm_seen.wait(), 0.1)
            return
    raise AssertionError("the lane never reached the consumer")


async def test_an_event_published_while_its_stream_elects_a_leader_comes_by_the_lane(
    cluster: list[EmbeddedServer],
) -> None:
    """The stream cannot store an event until its new leader is elected (seconds); its copy on
    the fast lane reaches the consumer meanwhile, the publish waits the election out, and the
    stored copy is not handled again."""
    victim, others = await beside_events_leader(cluster)
    consumer = await Bus.connect(others, "unicron/test-consumer", 20, replicas=3)
    publisher = await Bus.connect(others, "unicron/test-publisher", 20, replicas=3)
    handled: asyncio.Queue[str] = asyncio.Queue()
    warm_seen = asyncio.Event()

    async def on_event(raw: bytes) -> None:
        event_id = parse_event(raw).id
        if event_id == "evt-warm":  # the lane is open (lane_open)
            warm_seen.set()
        else:
            await handled.put(event_id)

    def event(index: int) -> JobStateChanged:
        return JobStateChanged(
            job_id=f"job-{index}", old=JobState.PENDING, new=JobState.STARTING, reason="lane"
        )

    try:
        await consumer.consume(ALL_EVENTS, "lane-events", bytes, on_event)
        await lane_open(publisher, warm_seen)
        victim.process.kill()
        # One call: the publish itself waits out the election to store the event.
        stored = asyncio.create_task(publisher.publish_event(event(0), event_id="evt-0"))
        assert await asyncio.wait_for(handled.get(), 30) == "evt-0"
        assert not stored.done()  # it came before the stream could store it
        await stored
        await until_acked(lambda: publisher.publish_event(event(1), event_id="evt-1"))
        # next is evt-1: the stored copy of evt-0 was skipped
        assert await asyncio.wait_for(handled.get(), 30) == "evt-1"
    finally:
        await publisher.close()
        await consumer.close()
