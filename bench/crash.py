"""One Unicron crash trial, as the recovery rows measure it: SIGKILL a worker of a running job,
then the fault → next completed step from the events (``failure.observed_at`` plus the
``transition.completed`` downtime), the steps lost and where the state came from."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from typing import Any

from bench.harness import BenchCluster
from bench.trials import Series, Trial, progress


async def completed(
    cluster: BenchCluster, job_id: str, after_gen: int, timeout_s: float
) -> tuple[float, dict[str, Any], dict[str, Any] | None]:
    """(arrival, transition.completed data, failure.detected data) of the first transition of a
    generation above ``after_gen``."""
    failure: dict[str, Any] | None = None
    async with asyncio.timeout(timeout_s):
        while True:
            event = await cluster.events.get()
            data = event.data
            if data.get("job_id") != job_id:
                continue
            if event.type == "failure.detected" and data.get("generation") == after_gen:
                failure = failure or data
            if event.type == "transition.completed" and data["generation"] > after_gen:
                return time.time(), data, failure


def trial_of(
    killed_at: float, step_before: int, arrived: float, done: dict[str, Any],
    failure: dict[str, Any] | None,
) -> Trial:  # fmt: skip
    first_step = arrived
    if failure is not None and done.get("downtime_s") is not None:
        first_step = failure["observed_at"] + done["downtime_s"]
    return Trial(
        recover_s=max(0.0, first_step - killed_at),
        lost_steps=max(0, step_before - int(done["resumed_step"])),
        source=str(done.get("state_source") or "?"),
        kind=str(done.get("kind") or "?"),
        phases=dict(done.get("phases") or {}),
        fallback=done.get("fallback"),
    )


async def spares_ready(
    cluster: BenchCluster, timeout_s: float = 60.0, per_node: int | None = 1
) -> bool:
    """Wait for steady state: every ready node has ``per_node`` (None: one per slot) warm spares
    again (agents replenish them in the background after serving a start), as said by a
    heartbeat sent after this call (an older one may predate the last start); False when that
    did not happen in time."""
    since = time.time()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        nodes = (await cluster.api.get("/v1/nodes")).raise_for_status().json()
        ready = [n for n in nodes if n["state"] == "READY"]
        fresh = all(n["last_heartbeat"] > since for n in ready)
        if (
            ready
            and fresh
            and all(n.get("spares_ready", 0) >= (per_node or n["slots"]) for n in ready)
        ):
            return True
        await asyncio.sleep(0.1)
    return False


def _pid(job: dict[str, Any], rank: int) -> int:
    return int(next(w["pid"] for w in job["workers"] if w["rank"] == rank))


async def crash_trials(
    cluster: BenchCluster, job_id: str, trials: int, name: str = "unicron crash (SEV2)"
) -> Series:
    series = Series(name)
    for _ in range(trials):
        job = await cluster.wait_job(job_id, world=4)
        if not await spares_ready(cluster):
            series.notes.append("a node had no warm spare at the fault")
        cluster.drain("transition.completed")
        cluster.drain("failure.detected")
        rank = random.randrange(4)
        job = await cluster.job(job_id)
        killed_at = time.time()
        os.kill(_pid(job, rank), signal.SIGKILL)
        arrived, done, failure = await completed(cluster, job_id, job["generation"], 120)
        series.trials.append(trial_of(killed_at, job["step"], arrived, done, failure))
        progress(series)
        if done.get("fallback"):
            series.notes.append(f"fallback: {done['fallback']}")
    return series
