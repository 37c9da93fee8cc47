"""Shared plumbing of the benchmarks: an embedded stack, its event stream, job helpers.

Benchmarks drive the real product (processes, NATS, Redis, torch workers) through its REST API
and read its events from NATS; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from unicron.cli.stack import Stack, StackConfig
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.procs import free_port

# Drills fail nodes on purpose: keep them from being quarantined, jobs from giving up, and the
# planner from learning a failure rate of one a minute (which rightly stops it growing jobs).
DRILL_ENV = {
    "UNICRON_QUARANTINE_THRESHOLD": "1000000",
    "UNICRON_MAX_RECOVERIES": "1000000",
    "UNICRON_PLANNER_FAILURE_PRIOR_GPU_H": "1000000000",
}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class BenchCluster:
    stack: Stack
    api: httpx.AsyncClient
    bus: Bus
    events: asyncio.Queue[CloudEvent] = field(default_factory=asyncio.Queue)

    async def submit(self, **spec: Any) -> str:
        response = await self.api.post("/v1/jobs", json=spec)
        response.raise_for_status()
        return str(response.json()["id"])

    async def job(self, job_id: str) -> dict[str, Any]:
        response = await self.api.get(f"/v1/jobs/{job_id}")
        response.raise_for_status()
        return dict(response.json())

    async def wait_job(
        self, job_id: str, world: int, advance: int = 3, timeout_s: float = 120.0
    ) -> dict[str, Any]:
        """Wait until the job runs on ``world`` live workers and has made ``advance`` steps."""
        deadline = time.monotonic() + timeout_s
        first: int | None = None
        while time.monotonic() < deadline:
            job = await self.job(job_id)
            live = [w for w in job["workers"] if w["state"] == "RUNNING" and w["pid"]]
            if job["state"] == "RUNNING" and len(live) == world == job["world_size"]:
                first = job["step"] if first is None else first
                if job["step"] - first >= advance:
                    return job
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{job_id} not running on {world} workers in {timeout_s}s")

    async def next_event(
        self, kind: str, timeout_s: float, **match: Any
    ) -> tuple[float, dict[str, Any]]:
        """(arrival time, data) of the next event of ``kind`` whose data has ``match``."""
        async with asyncio.timeout(timeout_s):
            while True:
                event = await self.events.get()
                if event.type == kind and all(event.data.get(k) == v for k, v in match.items()):
                    return time.time(), event.data

    def drain(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        """Events of ``kind`` already received, removed from the queue."""
        kept: list[CloudEvent] = []
        found: list[CloudEvent] = []
        while not self.events.empty():
            event = self.events.get_nowait()
            matches = all(event.data.get(k) == v for k, v in match.items())
            (found if event.type == kind and matches else kept).append(event)
        for event in kept:
            self.events.put_nowait(event)
        return [e.data for e in found]


@asynccontextmanager
async def bench_cluster(nodes: int = 2, slots: int = 2) -> AsyncIterator[BenchCluster]:
    """The stack a benchmark drives; with ``UNICRON_BENCH_DIR`` set its data and logs stay
    there for a post-mortem (by default they go with a temporary directory)."""
    keep = os.environ.get("UNICRON_BENCH_DIR")
    with tempfile.TemporaryDirectory(prefix="unicron-bench-") as tmp:
        config = StackConfig(
            nodes=nodes, slots=slots, api_port=free_port(), data_dir=Path(keep or tmp),
            log_level="WARNING", extra_env=dict(DRILL_ENV),
        )  # fmt: skip
        stack = Stack(config)
        await asyncio.to_thread(stack.start)
        try:
            bus = await Bus.connect(stack.nats_url, "unicron/bench", access=stack.operator_access())
            async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as api:
                cluster = BenchCluster(stack, api, bus)
                await bus.consume("unicron.events.>", "bench", parse_event, cluster.events.put,
                                  deliver_new=True)  # fmt: skip
                yield cluster
            await bus.close()
        finally:
            await asyncio.to_thread(stack.stop)
