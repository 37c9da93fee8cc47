"""Recovery benchmark (issue #5): how fast a job is stepping again after a fault, how much work
it redoes, and where the state came from.

A 4-worker GPT job on 2 agents x 2 slots. ``--trials`` SIGKILLs of one worker (SEV2) and
``--trials`` SIGKILLs of an agent (node loss, SEV1; the agent is restarted afterwards and the
job grows back). For each: fault → next completed step (the kill time against the new
generation's first step, ``failure.observed_at + transition.completed.downtime_s``), steps lost
(the step done before the fault minus the step the job resumed from) and the state source; the
phases of ``transition.completed``. The same crash runs under ``torchrun --max-restarts=3``
with a checkpoint every 10 steps (:mod:`bench.torchrun_recover`) in the same run. Prints a
table, then one JSON line, which also holds what the planner calibrated from these trials
(``GET /v1/calibration``): ``python -m unicron.simulator.calibrate --recover-json`` compares the
simulator's crash downtime with the measured one, with and without it.

    python bench/recover.py [--trials 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from bench.crash import completed, crash_trials, spares_ready, trial_of
from bench.harness import BenchCluster, bench_cluster, median, percentile
from bench.torchrun_recover import torchrun_crashes
from bench.trials import Series, progress
from bench.user_recover import user_script_rows

JOB = {
    "name": "recover-bench", "steps": 10_000_000, "min_workers": 2, "max_workers": 4,
    "global_batch": 8, "micro_batch": 2, "checkpoint_every": 10,
    "model": {"n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 32, "vocab": 64},
}  # fmt: skip
PHASES = ("detect", "plan", "regroup", "state_transfer", "first_step")


async def node_loss_trials(
    cluster: BenchCluster, job_id: str, trials: int
) -> tuple[Series, list[float]]:
    series = Series("unicron node loss (SEV1)")
    regrow: list[float] = []
    child = cluster.stack.children["agent-node-1"]
    for _ in range(trials):
        await cluster.wait_job(job_id, world=4)
        if not await spares_ready(cluster):
            series.notes.append("a node had no warm spare at the fault")
        cluster.drain("transition.completed")
        cluster.drain("failure.detected")
        job = await cluster.job(job_id)
        assert child.process is not None
        killed_at = time.time()
        child.process.kill()
        arrived, done, failure = await completed(cluster, job_id, job["generation"], 120)
        series.trials.append(trial_of(killed_at, job["step"], arrived, done, failure))
        progress(series)
        if done["world_size"] != 2:
            series.notes.append(f"expected a shrink to 2, got {done['world_size']}")
        if done.get("fallback"):
            series.notes.append(f"fallback: {done['fallback']}")
        back_at = time.time()
        await asyncio.to_thread(cluster.stack.restart_exited)
        while True:  # the node comes back; the planner grows the job again
            arrived, grown, _ = await completed(cluster, job_id, done["generation"], 180)
            if grown["world_size"] == 4:
                regrow.append(arrived - back_at)
                break
            done = grown
    return series, regrow


def _table(series: list[Series], regrow: list[float]) -> Table:
    table = Table(title="Recovery: fault → next completed step")
    for column in ("fault", "trials", "p50 s", "p99 s", "lost steps max", "source", "kind",
                   *(f"{p} p50" for p in PHASES)):  # fmt: skip
        table.add_column(
            column, justify="left" if column in ("fault", "source", "kind") else "right"
        )
    for s in series:
        sources = sorted({t.source for t in s.trials})
        kinds = sorted({t.kind + ("*" if t.fallback else "") for t in s.trials})
        cells = []
        for phase in PHASES:
            values = [t.phases[phase] for t in s.trials if phase in t.phases]
            cells.append(f"{median(values):.3f}" if values else "-")
        table.add_row(
            s.name, str(len(s.trials)), f"{median(s.recover()):.3f}",
            f"{percentile(s.recover(), 99):.3f}",
            str(max((t.lost_steps for t in s.trials), default=0)), ",".join(sources),
            ",".join(kinds), *cells,
        )  # fmt: skip
    if regrow:
        table.add_row("node back → 4 workers", str(len(regrow)), f"{median(regrow):.3f}",
                      f"{percentile(regrow, 99):.3f}", "", "", "", *[""] * len(PHASES))  # fmt: skip
    return table


async def planner_calibration(cluster: BenchCluster, timeout_s: float = 60.0) -> dict[str, Any]:
    """What the planner learnt from these trials (``GET /v1/calibration``), once a planning
    pass after the last one stored it: the input of ``python -m unicron.simulator.calibrate``."""
    since = time.time()
    async with asyncio.timeout(timeout_s):
        while True:
            response = await cluster.api.get("/v1/calibration")
            if response.status_code == 200 and (response.json().get("at") or 0) > since:
                return dict(response.json())
            await asyncio.sleep(0.5)


async def gpt_rows(cluster: BenchCluster, trials: int) -> tuple[list[Series], dict[str, Any]]:
    """The reference GPT: crash and node-loss trials, torchrun on the same model, calibration."""
    job_id = await cluster.submit(**JOB)
    crash = await crash_trials(cluster, job_id, trials)
    node_loss, regrow = await node_loss_trials(cluster, job_id, trials)
    calibration = await planner_calibration(cluster)
    await cluster.api.post(f"/v1/jobs/{job_id}/cancel")
    try:
        torchrun = await asyncio.to_thread(torchrun_crashes, trials)
    except Exception as exc:  # keep the Unicron results; say why the baseline is missing
        torchrun = Series("torchrun crash (ckpt every 10)", notes=[f"baseline failed: {exc!r}"])
    unicron_crash, torch_crash = median(crash.recover()), median(torchrun.recover())
    REGROW.extend(regrow)
    return [crash, node_loss, torchrun], {
        "unicron_crash_s_p50": round(unicron_crash, 3),
        "unicron_node_loss_s_p50": round(median(node_loss.recover()), 3),
        "torchrun_crash_s_p50": round(torch_crash, 3),
        "ratio_p50": round(torch_crash / unicron_crash, 2) if unicron_crash > 0 else None,
        "unicron_lost_steps_max": max(
            (t.lost_steps for t in crash.trials + node_loss.trials), default=0
        ),
        "torchrun_lost_steps_max": max((t.lost_steps for t in torchrun.trials), default=0),
        "calibration": calibration,
    }


async def main(trials: int, suites: list[str]) -> dict[str, Any]:
    random.seed(0)
    rows: list[Series] = []
    figures: dict[str, Any] = {}
    async with bench_cluster() as cluster:
        for suite in suites:
            series, found = await SUITES[suite](cluster, trials)
            rows += series
            figures.update(found)
    console = Console(width=200)
    console.print(_table(rows, REGROW))
    for s in rows:
        for note in s.notes:
            console.print(f"[yellow]{s.name}: {note}[/yellow]")
    return figures


SUITES = {"gpt": gpt_rows, "user": user_script_rows}
REGROW: list[float] = []  # node back → 4 workers, from the GPT node-loss trials


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument(
        "--suite", choices=[*SUITES, "all"], default="all",
        help="gpt: the reference GPT rows; user: a user's script on the API, unmodified, torchrun",
    )  # fmt: skip
    args = parser.parse_args()
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    print(json.dumps(asyncio.run(main(args.trials, suites))))
