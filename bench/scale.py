"""Control-plane scale: the real api, detector, planner and executor against real NATS and
Redis, driven by simulated agents (``bench/scale_fleet.py``), from 64 to 2,048 nodes x 8 ranks.

At each size it submits a job mix shaped like a real cluster's (half the ranks in one job, the
rest in jobs of 1/8 to 1/32 of the cluster; 1/16 of the nodes free), measures the control
plane's CPU, Redis and NATS traffic and the API's list latency over a steady window, then
injects crashes, in-band exceptions, hangs and node losses into random ranks and measures
fault → ``failure.detected``, fault → the new generation's last command at an agent, and fault
→ ``transition.completed``. A hang's clock starts at its agent's verdict (the hang threshold
is the job's own step time, not the control plane's). Prints a table and one JSON line.

    python bench/scale.py                      # 64, 256, 1024, 2048 nodes
    python bench/scale.py --nodes 64 --trials 2 --window-s 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import median, percentile
from bench.scale_cluster import SLOTS, ScaleCluster, job_sizes, scale_cluster
from bench.scale_probe import Rates, latency_ms

FAULT_KINDS = ("crash", "exception", "hang", "node_loss")


@dataclass
class SizeResult:
    nodes: int
    start_s: float | None = None  # submit → every job RUNNING and stepping
    detect: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in FAULT_KINDS})
    commands: list[float] = field(default_factory=list)  # fault → last command of the new gen
    recovery: list[float] = field(default_factory=list)  # fault → transition.completed
    plan_s: list[float] = field(default_factory=list)  # the planner's phase of each recovery
    missed: list[str] = field(default_factory=list)
    rates: Rates | None = None
    api_jobs_ms: tuple[float, float] = (float("nan"), float("nan"))
    api_nodes_ms: tuple[float, float] = (float("nan"), float("nan"))

    def p(self, kind: str, q: float) -> float:
        return percentile(self.detect[kind], q)


async def steady(cluster: ScaleCluster, result: SizeResult, window_s: float) -> None:
    before = await cluster.probe.sample()
    deadline = time.monotonic() + window_s
    result.api_jobs_ms = await latency_ms(cluster.api, "/v1/jobs?limit=100", 20)
    result.api_nodes_ms = await latency_ms(cluster.api, "/v1/nodes", 10)
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
    result.rates = cluster.probe.rates(before, await cluster.probe.sample())


async def one_fault(cluster: ScaleCluster, result: SizeResult, kind: str, job_id: str,
                    rng: random.Random, timeout_s: float) -> None:  # fmt: skip
    job = await cluster.job(job_id)
    worker = rng.choice(job["workers"])
    cluster.forget_events()
    at = await cluster.fault(kind, job_id, job["generation"], worker["rank"], worker["node_id"])
    detected = await cluster.next_event("failure.detected", job_id, timeout_s)
    if detected is None:
        result.missed.append(f"{kind} of {job_id}: no failure.detected in {timeout_s:g} s")
        return
    result.detect[kind].append(detected["detected_at"] - at)
    if kind == "node_loss":  # it reboots: a cluster this full may need it back to recover
        await cluster.revive(worker["node_id"])
    done = await cluster.next_event("transition.completed", job_id, timeout_s)
    if done is None:
        result.missed.append(f"{kind} of {job_id}: no transition.completed in {timeout_s:g} s")
        return
    result.recovery.append(time.time() - at)
    result.plan_s.append(done["phases"].get("plan", float("nan")))
    arrivals = await cluster.command_arrivals(job_id)
    if done["generation"] in arrivals:
        result.commands.append(arrivals[done["generation"]] - at)


async def measure(nodes: int, args: argparse.Namespace, data_dir: Path) -> SizeResult:
    result = SizeResult(nodes)
    rng = random.Random(nodes)
    async with scale_cluster(nodes, args.step_s, data_dir) as cluster:
        started = time.monotonic()
        await cluster.submit_mix()
        start_timeout = args.start_timeout_s
        if not await cluster.wait_running(cluster.jobs, start_timeout):
            result.missed.append(f"the job mix was not RUNNING {start_timeout:g} s after submit")
            await steady(cluster, result, args.window_s)
            return result
        result.start_s = time.monotonic() - started
        await steady(cluster, result, args.window_s)
        for trial in range(args.trials):
            for kind in FAULT_KINDS:
                job_id = cluster.jobs[(trial + FAULT_KINDS.index(kind)) % len(cluster.jobs)]
                await one_fault(cluster, result, kind, job_id, rng, args.fault_timeout_s)
                await cluster.wait_running([job_id], args.fault_timeout_s)
    return result


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.3f}{unit}" if value < 100 else f"{value:.0f}{unit}"


def table(results: list[SizeResult]) -> str:
    rows = [("nodes x ranks", [f"{r.nodes} x {SLOTS}" for r in results])]
    rows.append(("largest job (ranks)", [str(job_sizes(r.nodes)[0]) for r in results]))
    rows.append(("job mix start (s)", [_fmt(r.start_s) for r in results]))
    for kind in FAULT_KINDS:
        cells = [f"{_fmt(r.p(kind, 50))}/{_fmt(r.p(kind, 99))}" for r in results]
        rows.append((f"{kind} detect p50/p99 (s)", cells))
    rows.append(("fault → commands p50 (s)", [_fmt(median(r.commands)) for r in results]))
    rows.append(("fault → recovered p50 (s)", [_fmt(median(r.recovery)) for r in results]))
    rows.append(("planner phase p50 (s)", [_fmt(median(r.plan_s)) for r in results]))
    for name in ("api", "detector", "planner", "executor"):
        rows.append((f"{name} cores", [_fmt(r.rates.cores.get(name) if r.rates else None)
                                       for r in results]))  # fmt: skip
    rows.append(("control plane cores", [_fmt(_rate(r, "control_plane_cores")) for r in results]))
    rows.append(("Redis ops/s", [_fmt(_rate(r, "redis_ops_per_s")) for r in results]))
    rows.append(("Redis memory (MiB)", [_fmt(_rate(r, "redis_mb")) for r in results]))
    rows.append(("NATS msgs/s", [_fmt(_rate(r, "nats_msgs_per_s")) for r in results]))
    rows.append(("GET /v1/jobs?limit=100 p99 (ms)", [_fmt(r.api_jobs_ms[1]) for r in results]))
    rows.append(("GET /v1/nodes p99 (ms)", [_fmt(r.api_nodes_ms[1]) for r in results]))
    rows.append(("faults missed", [str(len(r.missed)) for r in results]))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  " + "  ".join(f"{c:>14}" for c in cells)
                     for name, cells in rows)  # fmt: skip


def _rate(result: SizeResult, name: str) -> float | None:
    return None if result.rates is None else float(getattr(result.rates, name))


def figures(results: list[SizeResult]) -> dict[str, list[float | None]]:
    def clean(value: float | None) -> float | None:
        return None if value is None or value != value else round(value, 4)

    return {
        "nodes": [r.nodes for r in results],
        "crash_p99_s": [clean(r.p("crash", 99)) for r in results],
        "exception_p99_s": [clean(r.p("exception", 99)) for r in results],
        "hang_p99_s": [clean(r.p("hang", 99)) for r in results],
        "node_loss_p99_s": [clean(r.p("node_loss", 99)) for r in results],
        "recovery_p50_s": [clean(median(r.recovery)) for r in results],
        "start_s": [clean(r.start_s) for r in results],
        "control_plane_cores": [clean(_rate(r, "control_plane_cores")) for r in results],
        "redis_ops_per_s": [clean(_rate(r, "redis_ops_per_s")) for r in results],
        "nats_msgs_per_s": [clean(_rate(r, "nats_msgs_per_s")) for r in results],
        "api_jobs_p99_ms": [clean(r.api_jobs_ms[1]) for r in results],
        "faults_missed": [len(r.missed) for r in results],
    }


async def sweep(args: argparse.Namespace) -> list[SizeResult]:
    results = []
    for nodes in args.nodes:
        with tempfile.TemporaryDirectory(prefix=f"unicron-scale-{nodes}-") as tmp:
            result = await measure(nodes, args, Path(args.keep or tmp) / str(nodes))
        for why in result.missed:
            print(f"[{nodes} nodes] {why}", file=sys.stderr)
        results.append(result)
    return results


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=lambda s: [int(n) for n in s.split(",")],
                        default=[64, 256, 1024, 2048])  # fmt: skip
    parser.add_argument("--trials", type=int, default=3, help="faults of each kind per size")
    parser.add_argument("--step-s", type=float, default=10.0, help="the jobs' step time")
    parser.add_argument("--window-s", type=float, default=20.0, help="the steady window")
    parser.add_argument("--start-timeout-s", type=float, default=300.0)
    parser.add_argument("--fault-timeout-s", type=float, default=60.0)
    parser.add_argument("--keep", help="keep each size's data and logs under this directory")
    return parser.parse_args(argv)


def main() -> None:
    results = asyncio.run(sweep(parse()))
    print(table(results))
    print(json.dumps(figures(results)))


if __name__ == "__main__":
    main()
