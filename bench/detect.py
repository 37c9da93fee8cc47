"""Detection benchmark: how fast and how right Unicron names each kind of fault (issue #3).

A 4-worker GPT job on 2 agents x 2 slots. For each fault kind, ``--trials`` faults: fault →
``failure.detected`` latency (p50, p99), misclassified, failures per fault; a healthy stretch
with the other core busy counts false alarms. The same crash and hang run under torchrun in the
same run (see :mod:`bench.torchrun_baseline`). In-band exceptions are also shown apart: a peer
error (a connection reset, an NCCL timeout) that arrives alone waits the detector's correlation
window (0.15 s) for the root cause it is most likely a symptom of, by design; the others are
root causes, reported at once. Prints a table, then one JSON line.

    python bench/detect.py [--trials 20] [--healthy-steps 1000] [--kinds node_loss,hang]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from unicron.services.detector.signals import SECONDARY_CATEGORIES

from bench.harness import BenchCluster, bench_cluster, median, percentile
from bench.torchrun_baseline import torchrun_crash_and_hang

JOB = {
    "name": "detect-bench", "steps": 10_000_000, "min_workers": 2, "max_workers": 4,
    "global_batch": 16, "micro_batch": 4, "checkpoint_every": 50,
}  # fmt: skip
# (the default ~0.8M-parameter model: enough compute per step for a slow rank to show)

# Real texts of each family (NCCL watchdog, CUDA runtime, caching allocator, gloo).
EXCEPTIONS: dict[str, tuple[str, str]] = {
    "nccl_timeout": (
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=120, "
        "OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) ran for "
        "600012 milliseconds before timing out.", "nccl_timeout"),
    "ecc": ("CUDA error: uncorrectable ECC error encountered", "ecc"),
    "illegal_memory": ("CUDA error: an illegal memory access was encountered", "illegal_memory"),
    "cuda": ("CUDA error: unspecified launch failure", "cuda_error"),
    "oom": ("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; "
            "75.02 GiB already allocated; 1.12 GiB free)", "oom"),
    "network": ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
                "[10.1.2.3]:41234: Connection reset by peer", "connection_reset"),
    "software": ("KeyError: 'attention_mask'", "software_other"),
}  # fmt: skip


@dataclass
class KindResult:
    latencies: list[float] = field(default_factory=list)
    # Those of ``latencies`` that are peer errors (a connection reset, an NCCL timeout): the
    # detector waits its correlation window for the root cause they are likely a symptom of.
    peer_errors: list[float] = field(default_factory=list)
    root_causes: list[float] = field(default_factory=list)  # the others: reported at once
    misclassified: int = 0
    duplicates: int = 0
    notes: list[str] = field(default_factory=list)


async def _settle(cluster: BenchCluster, job_id: str, generation: int, world: int = 4) -> int:
    """Wait for the recovery, then count the failures recorded for ``generation``."""
    await cluster.wait_job(job_id, world=world)
    return len(cluster.drain("failure.detected", job_id=job_id, generation=generation))


async def _trial(
    cluster: BenchCluster,
    job_id: str,
    result: KindResult,
    inject: Any,
    expect: dict[str, Any],
    world_after: int = 4,
) -> dict[str, Any]:
    job = await cluster.wait_job(job_id, world=4)
    cluster.drain("failure.detected")
    gen = job["generation"]
    started, expected_rank = await inject(job)
    _, failure = await cluster.next_event("failure.detected", 30, job_id=job_id, generation=gen)
    result.latencies.append(failure["detected_at"] - (started or failure["observed_at"]))
    wanted = {**expect, **({"rank": expected_rank} if expected_rank is not None else {})}
    if any(failure.get(k) != v for k, v in wanted.items()):
        result.misclassified += 1
        result.notes.append(f"{wanted} got {[failure.get(k) for k in wanted]}")
    if failure["action"] != "report":
        result.duplicates += await _settle(cluster, job_id, gen, world_after)
    return failure


def _pid(job: dict[str, Any], rank: int) -> int:
    return int(next(w["pid"] for w in job["workers"] if w["rank"] == rank))


async def signal_trials(
    cluster: BenchCluster, job_id: str, trials: int, sig: signal.Signals, expect: dict[str, Any]
) -> KindResult:
    """SIGKILL (a crash) or SIGSTOP (a hang) of a random rank, timed from the signal."""
    result = KindResult()

    async def inject(job: dict[str, Any]) -> tuple[float, int]:
        rank = random.randrange(4)
        started = time.time()
        os.kill(_pid(job, rank), sig)
        return started, rank

    for _ in range(trials):
        await _trial(cluster, job_id, result, inject, expect)
    return result


async def exception_trials(cluster: BenchCluster, job_id: str, trials: int) -> KindResult:
    result = KindResult()
    families = list(EXCEPTIONS)
    for index in range(trials):
        message, category = EXCEPTIONS[families[index % len(families)]]

        async def inject(job: dict[str, Any], message: str = message) -> tuple[None, int]:
            rank = random.randrange(4)
            body = {"rank": rank, "kind": "exception", "message": message}
            (await cluster.api.post(f"/v1/jobs/{job['id']}/faults", json=body)).raise_for_status()
            return None, rank  # latency from the worker's own raise (observed_at)

        await _trial(cluster, job_id, result, inject, {"kind": "exception", "category": category})
        apart = result.peer_errors if category in SECONDARY_CATEGORIES else result.root_causes
        apart.append(result.latencies[-1])
    return result


async def node_loss_trials(cluster: BenchCluster, job_id: str, trials: int) -> KindResult:
    result = KindResult()
    child = cluster.stack.children["agent-node-1"]

    async def inject(job: dict[str, Any]) -> tuple[float, None]:
        assert child.process is not None
        started = time.time()
        child.process.kill()
        return started, None

    expect = {"kind": "node_lost", "node_id": "node-1", "severity": "SEV1"}
    for index in range(trials):
        try:
            await _trial(cluster, job_id, result, inject, expect, world_after=2)
        except TimeoutError:  # a miss is a result too: count it and go on
            result.misclassified += 1
            result.notes.append(f"trial {index}: no node_lost failure within 30 s")
        cluster.stack.restart_exited()  # the node comes back; the planner grows the job again
    return result


async def straggler_trials(cluster: BenchCluster, job_id: str, trials: int) -> KindResult:
    result = KindResult()
    for _ in range(trials):
        job = await cluster.wait_job(job_id, world=4)
        cluster.drain("failure.detected")
        rank, at_step = random.randrange(4), job["step"] + 3
        body = {"rank": rank, "kind": "slow", "slowdown": 2.0, "at_step": at_step}
        (await cluster.api.post(f"/v1/jobs/{job_id}/faults", json=body)).raise_for_status()
        _, failure = await cluster.next_event(
            "failure.detected", 120, job_id=job_id, generation=job["generation"]
        )
        result.latencies.append(float(failure["evidence"]["step"] - at_step + 1))
        if (failure["kind"], failure["rank"]) != ("straggler", rank):
            result.misclassified += 1
            result.notes.append(f"straggler rank {rank} got {failure['kind']}/{failure['rank']}")
        os.kill(_pid(await cluster.job(job_id), rank), signal.SIGKILL)  # clear the slowness
        await _settle(cluster, job_id, job["generation"])
    return result


async def false_alarms(cluster: BenchCluster, job_id: str, steps: int) -> tuple[int, float]:
    """Failures during ``steps`` healthy steps with a busy-looping process on the other core."""
    await cluster.wait_job(job_id, world=4)
    cluster.drain("failure.detected")
    burner = await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
    started = time.time()
    try:
        await cluster.wait_job(job_id, world=4, advance=steps, timeout_s=steps * 2.0)
    finally:
        burner.kill()
        await burner.wait()
    elapsed = time.time() - started
    return len(cluster.drain("failure.detected", job_id=job_id)), elapsed / steps


def _table(results: dict[str, KindResult], extra: dict[str, Any]) -> Table:
    table = Table(title="Unicron detection (fault → failure.detected)")
    for column in ("kind", "trials", "p50", "p99", "misclassified", "extra failures"):
        table.add_column(column, justify="right" if column != "kind" else "left")
    for kind, res in results.items():
        unit = " it" if kind == "straggler" else " s"
        table.add_row(kind, str(len(res.latencies)), f"{median(res.latencies):.3f}{unit}",
                      f"{percentile(res.latencies, 99):.3f}{unit}", str(res.misclassified),
                      str(res.duplicates))  # fmt: skip
        for label, part in (("  root causes", res.root_causes),
                            ("  peer errors (wait the window)", res.peer_errors)):  # fmt: skip
            if res.peer_errors and part:
                table.add_row(label, str(len(part)), f"{median(part):.3f}{unit}",
                              f"{percentile(part, 99):.3f}{unit}", "", "")  # fmt: skip
    for key, value in extra.items():
        table.add_row(key, "", str(value), "", "", "")
    return table


TRIALS: dict[str, Callable[[BenchCluster, str, int], Awaitable[KindResult]]] = {
    "crash": lambda c, j, n: signal_trials(c, j, n, signal.SIGKILL, {"kind": "crash"}),
    "exception": exception_trials,
    "hang": lambda c, j, n: signal_trials(
        c, j, n, signal.SIGSTOP, {"kind": "hang", "category": "task_hang"}
    ),
    "node_loss": node_loss_trials,
    "straggler": straggler_trials,
}
P99_KEYS = {"crash": "crash_p99_s", "exception": "exception_p99_s", "hang": "hang_p99_s",
            "node_loss": "node_loss_p99_s", "straggler": "straggler_iters_p99"}  # fmt: skip


async def main(trials: int, healthy_steps: int, kinds: list[str]) -> dict[str, Any]:
    random.seed(0)
    results: dict[str, KindResult] = {}
    async with bench_cluster() as cluster:
        job_id = await cluster.submit(**JOB)
        for kind in kinds:
            results[kind] = await TRIALS[kind](cluster, job_id, trials)
        alarms, iteration_s = await false_alarms(cluster, job_id, healthy_steps)
    torchrun = await asyncio.to_thread(torchrun_crash_and_hang)
    summary: dict[str, Any] = {
        key: percentile(results[kind].latencies, 99) if kind in results else None
        for kind, key in P99_KEYS.items()
    }
    if "exception" in results:
        exceptions = results["exception"]
        summary["exception_root_cause_p99_s"] = percentile(exceptions.root_causes, 99)
        summary["exception_peer_error_p99_s"] = percentile(exceptions.peer_errors, 99)
    summary |= {
        "misclassified": sum(r.misclassified for r in results.values()),
        "duplicates": sum(r.duplicates for r in results.values()),
        "false_alarms": alarms,
        "torchrun_crash_s": torchrun["crash_s"],
        "torchrun_hang_s": torchrun["hang_s"],
    }
    extra = {"median iteration (busy core)": f"{iteration_s:.3f} s",
             "hang goal (3 x iteration + 1 s)": f"{3 * iteration_s + 1:.2f} s",
             "false alarms / healthy steps": f"{alarms} / {healthy_steps}",
             "torchrun crash noticed": f"{torchrun['crash_s']:.2f} s",
             "torchrun hang noticed": f"{torchrun['hang_s']:.1f} s{torchrun['hang_note']}",
             "load average (1 min) at end": f"{os.getloadavg()[0]:.2f}"}  # fmt: skip
    console = Console(width=120)
    console.print(_table(results, extra))
    for kind, res in results.items():
        for note in res.notes:
            console.print(f"[yellow]{kind}: {note}[/yellow]")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--healthy-steps", type=int, default=1000)
    parser.add_argument(
        "--kinds", default=",".join(TRIALS), help=f"comma-separated subset of {','.join(TRIALS)}"
    )
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := sorted(set(kinds) - set(TRIALS)):
        parser.error(f"unknown kind {unknown[0]!r}; known: {', '.join(TRIALS)}")
    print(json.dumps(asyncio.run(main(args.trials, args.healthy_steps, kinds))))
