"""How long a kill -9 of one NATS server of three stalls the bus, and what the fast lane saves.

On a 3-server JetStream cluster (the streams at 3 replicas, as ``unicron up --ha`` runs them),
an event is published every 50 ms by a client of the two servers that live on, and read by
two consumers of those servers: a plain durable JetStream consumer and a ``Bus.consume``
consumer, which also reads the fast lane (shared/bus/lane.py). After 40 events one server is
killed: the events stream's leader, the plain consumer's leader, or neither (a server the
consumers are not on and that leads nothing they use). For each victim: the longest a publish
waited for JetStream's ack, and the longest an event took to reach each consumer.

    python bench/natsleader.py [--trials 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
import time
from pathlib import Path

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy, StreamInfo
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.bus.streams import ALL_EVENTS, EVENTS_STREAM
from unicron.shared.contracts.events import JobStateChanged
from unicron.shared.contracts.lifecycle import JobState
from unicron.shared.logging import configure_logging
from unicron.shared.outage import is_outage
from unicron.shared.servers.embedded import EmbeddedServer
from unicron.shared.servers.natscluster import cluster_url, start_nats_cluster

EVENTS, KILL_AT, EVERY_S = 200, 40, 0.05
VICTIMS = ("stream leader", "consumer leader", "other server")
PLAIN_INBOX = "bench.plain"  # where the plain durable consumer pushes


def _leader(info: StreamInfo | ConsumerInfo) -> int:
    """The index of the server (``nats-<i>``) that leads a stream or consumer."""
    assert info.cluster is not None and info.cluster.leader is not None
    return int(info.cluster.leader.rsplit("-", 1)[1])


async def _victim(bus: Bus, which: str, servers: list[EmbeddedServer]) -> int:
    stream = _leader(await bus.js.stream_info(EVENTS_STREAM))
    consumer = _leader(await bus.js.consumer_info(EVENTS_STREAM, "plain"))
    if which == "stream leader":
        return stream
    if which == "consumer leader":
        return consumer
    spare = [i for i in range(len(servers)) if i not in (stream, consumer)]
    return spare[0] if spare else -1


async def _publish(bus: Bus, index: int) -> float:
    event = JobStateChanged(
        job_id=f"j{index}", old=JobState.PENDING, new=JobState.STARTING, reason="b"
    )
    started = time.monotonic()
    while True:
        try:
            await bus.publish_event(event, event_id=f"e{index}")
            return time.monotonic() - started
        except Exception as exc:
            if not is_outage(exc):
                raise
            await asyncio.sleep(0.05)


async def trial(which: str) -> dict[str, float | str]:
    servers = start_nats_cluster(Path(tempfile.mkdtemp(prefix="natsleader-")) / "nats", size=3)
    try:
        setup = await Bus.connect(cluster_url(servers), "unicron/bench", 20, replicas=3)
        plain_at: dict[str, float] = {}
        lane_at: dict[str, float] = {}
        complete = asyncio.Event()

        def seen(at: dict[str, float], raw: bytes) -> None:
            at.setdefault(parse_event(raw).id, time.monotonic())
            if len(plain_at) == len(lane_at) == EVENTS:
                complete.set()

        async def on_plain(msg: Msg) -> None:
            seen(plain_at, msg.data)
            await msg.ack()

        async def on_bus(raw: bytes) -> None:
            seen(lane_at, raw)

        plain = ConsumerConfig(
            durable_name="plain", deliver_subject=PLAIN_INBOX, deliver_policy=DeliverPolicy.NEW,
            ack_policy=AckPolicy.EXPLICIT, ack_wait=1.0, filter_subject=ALL_EVENTS,
        )  # fmt: skip
        await setup.js.add_consumer(EVENTS_STREAM, plain)
        victim = await _victim(setup, which, servers)
        await setup.close()
        rest = ",".join(s.url for i, s in enumerate(servers) if i != victim)
        publisher = await Bus.connect(rest, "unicron/bench-pub", 20, replicas=3)
        reader = await Bus.connect(rest, "unicron/bench-read", 20, replicas=3)
        await reader.nc.subscribe(PLAIN_INBOX, cb=on_plain)
        await reader.consume(ALL_EVENTS, "with-lane", bytes, on_bus, deliver_new=True)
        sent: dict[str, float] = {}
        publish_s = 0.0
        for index in range(EVENTS):
            if index == KILL_AT and victim >= 0:
                servers[victim].process.kill()
            sent[f"e{index}"] = time.monotonic()
            publish_s = max(publish_s, await _publish(publisher, index))
            await asyncio.sleep(EVERY_S)
        with contextlib.suppress(TimeoutError):  # what never came counts as infinitely late
            await asyncio.wait_for(complete.wait(), 30)
        await publisher.close()
        await reader.close()

        def worst(seen: dict[str, float]) -> float:
            return max(
                seen.get(k, float("inf")) - at for k, at in sent.items() if int(k[1:]) >= KILL_AT
            )

        return {
            "victim": which,
            "publish_s": round(publish_s, 3),
            "jetstream_delivery_s": round(worst(plain_at), 3),
            "lane_delivery_s": round(worst(lane_at), 3),
        }
    finally:
        for server in servers:
            server.stop()


async def main(trials: int) -> list[dict[str, float | str]]:
    return [await trial(which) for _ in range(trials) for which in VICTIMS]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=1)
    args = parser.parse_args()
    configure_logging("bench", "WARNING")
    rows = asyncio.run(main(args.trials))
    print(f"{'server killed':<16} {'publish ack s':>14} {'JetStream s':>12} {'with lane s':>12}")
    for row in rows:
        figures = (row["publish_s"], row["jetstream_delivery_s"], row["lane_delivery_s"])
        print(f"{row['victim']:<16} {figures[0]:>14} {figures[1]:>12} {figures[2]:>12}")
    print(json.dumps({"runs": rows}))
