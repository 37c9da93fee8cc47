"""Monitoring overhead: the runtime's real training step with its in-band monitoring vs bare.

``python bench/overhead.py [--steps N] [--rounds R]``. One process trains the reference GPT
of a default job (``JobSpec()``: 4 layers, width 128, 16 sequences of 64 tokens a step) on one
thread, in a world-size-1 gloo group over a TCP store the bench hosts. Both variants run
:func:`trainer.loop.run_step`, the runtime's own step:

- monitored: with a :class:`~trainer.loop.StepMonitor` — a ``WorkerPhase`` at compute and at
  the all-reduce, compute timing, the fault-directive check, a ``StepCompleted`` with
  ``compute_s`` — sent through the runtime's ``AgentChannel`` to a stand-in agent, a separate
  process (as the real agent is) that reads and counts every line;
- bare: ``monitor=None`` — no channel, no phases, no timing.

Rounds alternate A B A B … so that drift (other load, clocks, allocator warm-up) hits both
alike. Prints a table of per-round and overall median step times, then as its last line one
JSON object: ``{"overhead_pct": …, "monitored_median_s": …, "bare_median_s": …}``.
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

from unicron.shared.messages import Rendezvous, WorkerLaunch
from unicron.shared.models import JobSpec
from unicron.shared.procs import die_with_parent, free_port
from unicron.shared.reports import WorkerHello
from unicron.trainer.channel import AgentChannel
from unicron.trainer.faults import FaultInbox
from unicron.trainer.loop import StepMonitor, Trainee, run_step
from unicron.trainer.model import build_model
from unicron.trainer.parallel import make_optimizer
from unicron.trainer.runtime import RuntimeOptions, join_process_group

WARMUP = 5
LINES_PER_STEP = 3  # phase compute, phase collective, step completed

# The stand-in agent: accepts the worker's connection, counts its lines until stdin closes.
AGENT = r"""
import socket, sys, threading
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(sys.argv[1])
server.listen()
counts, readers = [], []
def read(conn):
    n = 0
    with conn, conn.makefile("rb") as lines:
        for _ in lines:
            n += 1
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
print(sum(counts), flush=True)
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


def lines_received(agent: subprocess.Popen[str]) -> int:
    out, _ = agent.communicate(timeout=30)  # closing its stdin tells it the bench is done
    return int(out.strip())


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


def timed_steps(
    trainee: Trainee, steps: itertools.count[int], n: int, monitor: StepMonitor | None
) -> list[float]:
    times = []
    for _ in range(n):
        began = time.perf_counter()
        run_step(trainee, next(steps), monitor)
        times.append(time.perf_counter() - began)
    return times


def measure(
    trainee: Trainee, monitor: StepMonitor, steps_per_round: int, rounds: int
) -> list[tuple[list[float], list[float]]]:
    """``rounds`` pairs of (monitored, bare) step times, run A B A B …"""
    steps = itertools.count(1)
    timed_steps(trainee, steps, WARMUP, monitor)
    timed_steps(trainee, steps, WARMUP, None)
    return [
        (
            timed_steps(trainee, steps, steps_per_round, monitor),
            timed_steps(trainee, steps, steps_per_round, None),
        )
        for _ in range(rounds)
    ]


def pct(monitored: float, bare: float) -> float:
    return 100.0 * (monitored - bare) / bare


def report(results: list[tuple[list[float], list[float]]], delivered: str) -> dict[str, float]:
    table = Table(title="Step time with in-band monitoring vs bare (medians)")
    for column in ("round", "monitored ms", "bare ms", "overhead"):
        table.add_column(column, justify="right")
    for i, (monitored, bare) in enumerate(results, start=1):
        m, b = statistics.median(monitored), statistics.median(bare)
        table.add_row(str(i), f"{m * 1e3:.3f}", f"{b * 1e3:.3f}", f"{pct(m, b):+.2f}%")
    m = statistics.median(t for monitored, _ in results for t in monitored)
    b = statistics.median(t for _, bare in results for t in bare)
    table.add_row("all", f"{m * 1e3:.3f}", f"{b * 1e3:.3f}", f"{pct(m, b):+.2f}%", style="bold")
    console = Console()
    console.print(table)
    console.print(f"per step: {(m - b) * 1e6:+.1f} µs; channel: {delivered}", soft_wrap=True)
    return {"overhead_pct": round(pct(m, b), 3), "monitored_median_s": m, "bare_median_s": b}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="steps per round and variant")
    parser.add_argument("--rounds", type=int, default=16, help="rounds of each variant")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the runtime does: one thread per rank
    with tempfile.TemporaryDirectory(prefix="unicron-bench-", dir="/tmp") as tmp:
        port = free_port()
        store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        launch = make_launch(Path(tmp), port)
        agent = start_agent(launch.agent_socket)
        spec = launch.spec
        model = build_model(spec.model, spec.seed)
        group = join_process_group(launch, "gloo", RuntimeOptions())
        trainee = Trainee(launch, model, make_optimizer(model), group)
        inbox = FaultInbox(launch.rank)
        channel = AgentChannel(launch.agent_socket, on_directive=inbox.offer)
        channel.send(WorkerHello(job_id=launch.job_id, generation=1, rank=0))
        results = measure(trainee, StepMonitor(launch, channel, inbox), args.steps, args.rounds)
        sent = 1 + LINES_PER_STEP * (WARMUP + args.steps * args.rounds)
        flushed = channel.flush(10.0)
        channel.close()
        got = lines_received(agent)
        del store
    delivered = f"{got}/{sent} lines reached the stand-in agent, {channel.dropped} dropped"
    assert flushed and got == sent, delivered
    print(json.dumps(report(results, delivered)))


if __name__ == "__main__":
    main()
