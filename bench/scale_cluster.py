"""The cluster ``bench/scale.py`` measures: its own NATS (with the monitoring port) and Redis, the
real api, detector, planner and executor (``unicron.cli.stack`` with no agents of its own), and
fleets of simulated agents (``bench/scale_fleet.py``), with a job mix shaped like a real
cluster's at every size."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from unicron.cli.stack import Stack, StackConfig
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.bus.streams import ALL_EVENTS
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.procs import die_with_parent, free_port
from unicron.shared.servers.embedded import (
    EmbeddedServer,
    nats_server_binary,
    spawn_server,
    start_redis,
)

from bench.harness import DRILL_ENV
from bench.scale_probe import Probe
from bench.scale_wire import FAULT_SUBJECT, REVIVE_SUBJECT

NODES_PER_FLEET = 512
SLOTS = 8
# Shares of the cluster's ranks: one job of half of it, the rest 512-2,048 ranks at 2,048 nodes;
# 1/16 of the nodes stay free, as a real cluster keeps some to replace a lost node.
JOB_SHARES = (1 / 2, 1 / 8, 1 / 16, 1 / 16, 1 / 32, 1 / 32, 1 / 32, 1 / 32, 1 / 32, 1 / 32)
ROOT = Path(__file__).resolve().parent.parent


def job_sizes(nodes: int) -> list[int]:
    return [max(1, round(share * nodes * SLOTS)) for share in JOB_SHARES]


def start_monitored_nats(workdir: Path) -> tuple[EmbeddedServer, str]:
    """A NATS server like the embedded one, with its monitoring endpoint for /varz."""
    port, monitor = free_port(), free_port()
    store = workdir / "jetstream"
    store.mkdir(parents=True, exist_ok=True)
    cmd = [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store),
           "-m", str(monitor)]  # fmt: skip
    server = spawn_server(
        "nats-server", cmd, port, f"nats://127.0.0.1:{port}", workdir / "nats.log"
    )
    return server, f"http://127.0.0.1:{monitor}"


@dataclass
class ScaleCluster:
    nodes: int
    stack: Stack
    api: httpx.AsyncClient
    bus: Bus
    probe: Probe
    fleets: list[subprocess.Popen[bytes]]
    events: asyncio.Queue[CloudEvent] = field(default_factory=asyncio.Queue)
    jobs: list[str] = field(default_factory=list)

    async def submit_mix(self) -> None:
        for index, ranks in enumerate(job_sizes(self.nodes)):
            spec = {
                "name": f"scale-{index}", "steps": 10_000_000, "min_workers": ranks,
                "max_workers": ranks, "global_batch": ranks, "micro_batch": 1,
                "checkpoint_every": 10_000_000, "max_restarts": 1000,
            }  # fmt: skip
            response = await self.api.post("/v1/jobs", json=spec)
            response.raise_for_status()
            self.jobs.append(str(response.json()["id"]))

    async def job(self, job_id: str) -> dict[str, Any]:
        response = await self.api.get(f"/v1/jobs/{job_id}")
        response.raise_for_status()
        return dict(response.json())

    async def wait_running(self, job_ids: list[str], timeout_s: float) -> bool:
        """Until every job in ``job_ids`` is RUNNING and stepping; False when time ran out."""
        deadline = time.monotonic() + timeout_s
        waiting = list(job_ids)
        while waiting and time.monotonic() < deadline:
            job = await self.job(waiting[0])
            if job["state"] == "RUNNING" and job["step"] > 0:
                waiting.pop(0)
            else:
                await asyncio.sleep(0.2)
        return not waiting

    async def wait_nodes(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            nodes = (await self.api.get("/v1/nodes")).json()
            if sum(n["state"] == "READY" for n in nodes) >= self.nodes:
                return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"{self.nodes} simulated nodes not READY in {timeout_s:g} s")

    async def fault(self, kind: str, job_id: str, generation: int, rank: int, node: str) -> float:
        """Tell the fleets to inject ``kind`` into one rank; returns when it was sent."""
        ask = {"kind": kind, "job_id": job_id, "generation": generation, "rank": rank,
               "node_id": node}  # fmt: skip
        at = time.time()
        await self.bus.nc.publish(FAULT_SUBJECT, json.dumps(ask).encode())
        await self.bus.nc.flush()
        return at

    async def revive(self, node: str) -> None:
        await self.bus.nc.publish(REVIVE_SUBJECT, node.encode())

    async def command_arrivals(self, job_id: str) -> dict[int, float]:
        """Generation → when its last command reached a simulated agent."""
        last: dict[int, float] = {}
        for index in range(len(self.fleets)):
            reply = await self.bus.nc.request(f"bench.scale.{index}.commands", job_id.encode(), 5)
            for generation, arrivals in json.loads(reply.data).items():
                last[int(generation)] = max(last.get(int(generation), 0.0), arrivals["last"])
        return last

    async def fleet_status(self) -> list[dict[str, Any]]:
        replies = [
            await self.bus.nc.request(f"bench.scale.{index}.status", b"", 5)
            for index in range(len(self.fleets))
        ]
        return [json.loads(r.data) for r in replies]

    async def next_event(self, kind: str, job_id: str, timeout_s: float) -> dict[str, Any] | None:
        """The next event of ``kind`` about ``job_id``; None when none came in time."""
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    event = await self.events.get()
                    if event.type == kind and event.data.get("job_id") == job_id:
                        return dict(event.data)
        except TimeoutError:
            return None

    def forget_events(self) -> None:
        while not self.events.empty():
            self.events.get_nowait()


def _spawn_fleets(nodes: int, nats: str, redis: str, step_s: float, logs: Path) -> list[Any]:
    fleets = []
    for index, first in enumerate(range(0, nodes, NODES_PER_FLEET)):
        count = min(NODES_PER_FLEET, nodes - first)
        cmd = [sys.executable, "-m", "bench.scale_fleet", "--index", str(index),
               "--first", str(first), "--count", str(count), "--slots", str(SLOTS),
               "--nats", nats, "--redis", redis, "--step-s", str(step_s)]  # fmt: skip
        with (logs / f"fleet-{index}.log").open("ab") as log:
            fleets.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log,
                                           preexec_fn=die_with_parent))  # fmt: skip
    for fleet in fleets:  # each prints "ready" once its nodes registered
        lines = iter(fleet.stdout.readline, b"") if fleet.stdout else iter(())
        if not any(line.strip() == b"ready" for line in lines):
            raise RuntimeError(f"a fleet of simulated agents failed to start; see {logs}")
    return fleets


@asynccontextmanager
async def scale_cluster(nodes: int, step_s: float, data_dir: Path) -> AsyncIterator[ScaleCluster]:
    nats, monitor = start_monitored_nats(data_dir / "nats")
    redis = start_redis(data_dir / "redis")
    stack = Stack(StackConfig(
        nodes=0, nats_url=nats.url, redis_url=redis.url, api_port=free_port(),
        data_dir=data_dir, log_level="WARNING", extra_env=dict(DRILL_ENV),
    ))  # fmt: skip
    fleets: list[Any] = []
    try:
        await asyncio.to_thread(stack.start)
        pids = {name: c.process.pid for name, c in stack.children.items() if c.process}
        bus = await Bus.connect(nats.url, "unicron/bench")
        fleets = await asyncio.to_thread(
            _spawn_fleets, nodes, nats.url, redis.url, step_s, data_dir / "logs"
        )
        probe = Probe(pids, redis.url, monitor)
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=60) as api:
            cluster = ScaleCluster(nodes, stack, api, bus, probe, fleets)
            await bus.consume(ALL_EVENTS, "bench", parse_event, cluster.events.put,
                              deliver_new=True)  # fmt: skip
            await cluster.wait_nodes(60 + nodes / 20)
            yield cluster
        await probe.close()
        await bus.close()
    finally:
        for fleet in fleets:
            fleet.terminate()
        for fleet in fleets:  # a fleet that ignores SIGTERM (a loaded machine) must not cost
            try:  # the run its figures, which are printed after this teardown
                fleet.wait(10)
            except subprocess.TimeoutExpired:
                fleet.kill()
                fleet.wait()
        await asyncio.to_thread(stack.stop)
        redis.stop()
        nats.stop()
