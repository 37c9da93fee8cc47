"""What ``bench/scale.py`` reads off the running control plane: CPU seconds of each service
process (from /proc), Redis's command count and memory (INFO), the NATS server's messages in and
out (its monitoring endpoint's /varz), and the latency of the API's list endpoints."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import httpx
import redis.asyncio as aioredis

from bench.harness import percentile

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children (uvicorn has none)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    # after the command: state is fields[0], so utime/stime (14, 15 in proc(5)) are 11, 12
    return (int(fields[11]) + int(fields[12])) / TICKS


@dataclass(frozen=True)
class Sample:
    at: float
    cpu: dict[str, float]  # service → CPU seconds so far
    redis_commands: int
    redis_bytes: int
    nats_msgs: int  # in + out, as the server counts them


@dataclass(frozen=True)
class Rates:
    cores: dict[str, float]
    redis_ops_per_s: float
    redis_mb: float
    nats_msgs_per_s: float

    @property
    def control_plane_cores(self) -> float:
        return sum(self.cores.values())


class Probe:
    def __init__(self, pids: dict[str, int], redis_url: str, nats_monitor: str) -> None:
        self.pids = pids
        self.redis = aioredis.Redis.from_url(redis_url)
        self.nats_monitor = nats_monitor

    async def sample(self) -> Sample:
        info = await self.redis.info()
        async with httpx.AsyncClient(timeout=5.0) as client:
            varz = (await client.get(f"{self.nats_monitor}/varz")).json()
        return Sample(
            at=time.monotonic(),
            cpu={name: cpu_seconds(pid) for name, pid in self.pids.items()},
            redis_commands=int(info["total_commands_processed"]),
            redis_bytes=int(info["used_memory"]),
            nats_msgs=int(varz["in_msgs"]) + int(varz["out_msgs"]),
        )

    @staticmethod
    def rates(before: Sample, after: Sample) -> Rates:
        span = max(after.at - before.at, 1e-9)
        return Rates(
            cores={n: (after.cpu[n] - before.cpu[n]) / span for n in after.cpu},
            redis_ops_per_s=(after.redis_commands - before.redis_commands) / span,
            redis_mb=after.redis_bytes / 2**20,
            nats_msgs_per_s=(after.nats_msgs - before.nats_msgs) / span,
        )

    async def close(self) -> None:
        await self.redis.aclose()


async def latency_ms(api: httpx.AsyncClient, path: str, requests: int) -> tuple[float, float]:
    """p50 and p99 of ``requests`` sequential GETs of ``path``, in milliseconds."""
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        response = await api.get(path)
        response.raise_for_status()
        times.append((time.perf_counter() - started) * 1000)
    return percentile(times, 50), percentile(times, 99)
