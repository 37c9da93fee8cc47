"""Monitoring overhead: the runtime's real training step with its in-band monitoring vs bare.

``python bench/overhead.py [--steps N] [--rounds R] [--device cpu|cuda]
[--variant gpt|user|reference] [--batch-ms MS]``. One process trains on one thread, in a
world-size-1 group (gloo on the CPU, NCCL on CUDA) over a TCP store the bench hosts: ``gpt``
the reference GPT of a default job (``JobSpec()``: 4 layers, width 128, 16 sequences of 64
tokens a step), ``user`` a user's MLP on a map-style dataset through the training API's data
path, ``reference`` the ~10-ms step of docs/gpu-probe.md (a 4 x 2048 MLP in bf16 on 7168
tokens; :mod:`bench.overhead_variants`). The variant is ``gpt`` on the CPU and ``reference`` on
CUDA unless named; ``--device cuda`` without a GPU exits with code 2. Both ways run the
runtime's own step (:func:`unicron.trainer.loop.run_step`):

- monitored: with a :class:`~unicron.trainer.loop.StepMonitor` — a ``WorkerPhase`` at compute and at
  the all-reduce, compute timing, the fault-directive check, a ``StepCompleted`` with
  ``compute_s`` — sent through the runtime's ``AgentChannel`` to a stand-in agent, a separate
  process (as the real agent is) that reads every line and notes how late it came (now minus
  the report's ``at``);
- bare: ``monitor=None`` — no channel, no phases, no timing.

Rounds alternate A B A B … so that drift (other load, clocks, allocator warm-up) hits both
alike; ``paired_overhead_pct`` is the median of the rounds' own overheads, which drift cancels
from. ``hot_path_us`` is the median time a step spends inside the monitor's calls, the direct
cost that load on a shared machine cannot blur. Prints a table of per-round and overall medians,
then as its last line one JSON object: ``{"overhead_pct": …, "paired_overhead_pct": …,
"hot_path_us": …, "monitored_median_s": …, "bare_median_s": …, "latency_ms": {"p50": …,
"p99": …, "max": …}, "device": …, "variant": …}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from torch.distributed import TCPStore  # type: ignore[attr-defined]
from unicron.shared.contracts.messages import Rendezvous
from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.reports import WorkerHello
from unicron.shared.contracts.workerchannel import WorkerLaunch
from unicron.shared.procs import die_with_parent, free_port
from unicron.trainer.channel import BATCH_S, AgentChannel
from unicron.trainer.faults import FaultInbox
from unicron.trainer.regroup import RegroupInbox
from unicron.trainer.runtime import RuntimeOptions, directive_router, join_process_group

from bench.overhead_variants import VARIANTS, Setup, Variant

WARMUP = 5

# The stand-in agent: accepts the worker's connection, reads its lines until stdin closes, and
# prints how many came and how late (now minus the report's own ``at`` wall-clock stamp).
AGENT = r"""
import json, socket, sys, threading, time
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sys.argv[1])
server.listen()
counts, late, readers = [], [], []
def read(conn):
    n = 0
    with conn, conn.makefile("rb") as lines:
        for line in lines:
            n += 1
            at = json.loads(line).get("at")
            if at is not None:
                late.append(time.time() - at)
    counts.append(n)
def accept():
    while True:
        conn, _ = server.accept()
        reader = threading.Thread(target=read, args=(conn,))
        readers.append(reader)
        reader.start()
threading.Thread(target=accept, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
for reader in readers:
    reader.join(10)
late.sort()
q = lambda f: round(1e3 * late[min(len(late) - 1, int(f * len(late)))], 3) if late else None
print(json.dumps({"lines": sum(counts), "p50": q(0.5), "p99": q(0.99), "max": q(1.0)}))
"""


def start_agent(path: str) -> subprocess.Popen[str]:
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,
    )
    assert agent.stdout is not None and agent.stdout.readline().strip() == "ready"
    return agent


def agent_summary(agent: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = agent.communicate(timeout=30)  # closing its stdin tells it the bench is done
    summary: dict[str, float] = json.loads(out)
    return summary


def make_launch(scratch: Path, store_port: int) -> WorkerLaunch:
    # Never due: a checkpoint is not monitoring, and neither variant should pay for one.
    spec = JobSpec(name="bench", steps=10_000_000, checkpoint_every=10_000_000)
    return WorkerLaunch(
        node_id="bench",
        job_id="bench",
        generation=1,
        rank=0,
        world_size=1,
        spec=spec,
        rendezvous=Rendezvous(host="127.0.0.1", port=store_port, prefix="bench/"),
        checkpoint_dir=str(scratch / "ck"),
        agent_socket=str(scratch / "agent.sock"),
    )


Times = list[float]  # seconds a step


def timed_steps(
    variant: Variant, steps: itertools.count[int], n: int, monitored: bool, hot: list[int]
) -> Times:
    times = []
    for _ in range(n):
        began, hot_began = time.perf_counter(), variant.hot_ns()
        variant.step(next(steps), monitored)
        times.append(time.perf_counter() - began)
        hot.append(variant.hot_ns() - hot_began)
    return times


def measure(
    variant: Variant, steps_per_round: int, rounds: int
) -> tuple[list[tuple[Times, Times]], float]:
    """``rounds`` pairs of (monitored, bare) step times, run A B A B …, and the median time a
    monitored step spent in monitoring calls (µs; a preempted call makes the mean useless)."""
    steps, hot, ignored = itertools.count(1), list[int](), list[int]()
    timed_steps(variant, steps, WARMUP, True, ignored)
    timed_steps(variant, steps, WARMUP, False, ignored)
    results = [
        (
            timed_steps(variant, steps, steps_per_round, True, hot),
            timed_steps(variant, steps, steps_per_round, False, ignored),
        )
        for _ in range(rounds)
    ]
    return results, statistics.median(hot) / 1e3


def pct(monitored: float, bare: float) -> float:
    return 100.0 * (monitored - bare) / bare


def overall(results: list[tuple[Times, Times]], which: int) -> float:
    return statistics.median(t for pair in results for t in pair[which])


def report(
    results: list[tuple[Times, Times]], hot_us: float, delivered: str, latency: dict[str, float]
) -> dict[str, object]:
    table = Table(title="Step time with in-band monitoring vs bare (medians)")
    for column in ("round", "monitored ms", "bare ms", "overhead"):
        table.add_column(column, justify="right")
    for i, (monitored, bare) in enumerate(results, start=1):
        m, b = statistics.median(monitored), statistics.median(bare)
        table.add_row(str(i), f"{m * 1e3:.3f}", f"{b * 1e3:.3f}", f"{pct(m, b):+.2f}%")
    m, b = overall(results, 0), overall(results, 1)
    table.add_row("all", f"{m * 1e3:.3f}", f"{b * 1e3:.3f}", f"{pct(m, b):+.2f}%", style="bold")
    # Each round against its own neighbour: load that drifts over the run cancels out.
    paired = statistics.median(
        pct(statistics.median(mon), statistics.median(bare)) for mon, bare in results
    )
    console = Console()
    console.print(table)
    console.print(
        f"per step: {(m - b) * 1e6:+.1f} µs; median of the rounds' overheads: {paired:+.2f}%;"
        f" in monitoring calls: {hot_us:.1f} µs a step; report latency ms: {latency};"
        f" channel: {delivered}",
        soft_wrap=True,
    )
    return {
        "overhead_pct": round(pct(m, b), 3),
        "paired_overhead_pct": round(paired, 3),
        "hot_path_us": round(hot_us, 1),
        "monitored_median_s": m,
        "bare_median_s": b,
        "latency_ms": latency,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="steps per round and variant")
    parser.add_argument("--rounds", type=int, default=16, help="rounds of each variant")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--variant", choices=sorted(VARIANTS), help="gpt on the CPU, reference on CUDA"
    )
    parser.add_argument(
        "--batch-ms", type=float, default=BATCH_S * 1e3, help="the channel writer's tick"
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        built = torch.version.cuda or "no CUDA"
        parser.exit(2, f"--device cuda: torch {torch.__version__} ({built}) sees no CUDA GPU\n")
    if args.variant is None:
        args.variant = "reference" if args.device == "cuda" else "gpt"
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)  # as the runtime does: one thread per rank
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)  # before the group: NCCL binds its communicator to it
    with tempfile.TemporaryDirectory(prefix="unicron-bench-", dir="/tmp") as tmp:
        port = free_port()
        store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        launch = make_launch(Path(tmp), port)
        agent = start_agent(launch.agent_socket)
        backend = "nccl" if device.type == "cuda" else "gloo"
        group = join_process_group(launch, backend, RuntimeOptions())
        inbox = FaultInbox(launch.rank)
        channel = AgentChannel(
            launch.agent_socket,
            on_directive=directive_router(inbox, RegroupInbox(launch.job_id, 1)),
            batch_s=args.batch_ms / 1e3,
        )
        channel.send(WorkerHello(job_id=launch.job_id, generation=1, rank=0))
        variant = VARIANTS[args.variant](Setup(launch, channel, inbox, group, device))
        results, hot_us = measure(variant, args.steps, args.rounds)
        sent = 1 + variant.lines_per_step * (WARMUP + args.steps * args.rounds)
        flushed = channel.flush(10.0)
        channel.close()
        summary = agent_summary(agent)
        del store
    got = int(summary.pop("lines"))
    delivered = f"{got}/{sent} lines reached the stand-in agent, {channel.dropped} dropped"
    assert flushed and got == sent, delivered
    figures = report(results, hot_us, delivered, summary)
    print(json.dumps({**figures, "device": args.device, "variant": args.variant}))


if __name__ == "__main__":
    main()
