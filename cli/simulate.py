"""``unicron simulate``: replay a failure trace on a simulated cluster under each recovery
policy and compare their accumulated WAF (the :mod:`simulator` package).

    unicron simulate --cluster examples/sim/cluster-128.json --jobs examples/sim/jobs-128.json \
        --generate --rate 1.6e-3 --days 30 --seed 1 --policy all --out out/dense

Writes ``OUT/summary.json``, ``OUT/timeline-<policy>.csv``, ``OUT/waf.png`` (WAF over time, all
policies), ``OUT/gpus.png`` (GPUs per job over time) and, with ``--generate``, the trace it
drew as ``OUT/trace.csv``. Exit code 2 on a bad input file (the message names line and field).
``--fairness waf|aging|guaranteed_min`` (and ``--aging-hours``) picks the planner's policy
against starvation (planning/fairness.py); the tables show each policy's and each
job's hours waiting: admitted, holding no GPUs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from unicron.planning.calibration import LLAMA3_FAILURES_PER_GPU_H
from unicron.planning.fairness import PlanRules
from unicron.shared.contracts.plans import Fairness
from unicron.simulator.inputs import InputError
from unicron.simulator.plots import plot_gpus, plot_waf
from unicron.simulator.policies import NAMES
from unicron.simulator.runner import run_all
from unicron.simulator.scenario import Options, build_scenario, parse_throughput
from unicron.simulator.trace import write_trace

EXIT_REFUSED = 2
FileArg = Annotated[Path, typer.Option(exists=False, dir_okay=False, show_default=False)]


def _table(summary: dict[str, object]) -> Table:
    table = Table(title="accumulated WAF by policy")
    for header in (
        "policy",
        "acc. WAF (w·ZFLOP)",
        "vs unicron",
        "ETTR",
        "failures",
        "job hits",
        "downtime (h)",
        "waiting (h)",
    ):
        table.add_column(header, justify="right")
    policies = summary["policies"]
    assert isinstance(policies, dict)
    top = policies.get("unicron", {}).get("accumulated_waf")
    for name, p in policies.items():
        rel = f"{top / p['accumulated_waf']:.2f}x" if top and p["accumulated_waf"] else "-"
        table.add_row(
            name,
            f"{p['accumulated_waf'] / 1e21:.2f}",
            rel,
            f"{p['ettr']:.3f}",
            str(p["failures"]),
            str(p["job_hits"]),
            f"{p['downtime_s'] / 3600:.1f}",
            f"{p['wait_s'] / 3600:.1f}",
        )
    return table


def waiting_table(summary: dict[str, Any]) -> Table:
    """Each job's waiting (admitted, no GPUs) and first start, per policy, in hours."""
    policies = summary["policies"]
    table = Table(title="waiting per job, hours (first start)")
    table.add_column("job")
    for name in policies:
        table.add_column(name, justify="right")
    jobs = next(iter(policies.values()))["jobs"] if policies else {}
    for job in jobs:
        cells = []
        for p in policies.values():
            figures = p["jobs"][job]
            first = figures["first_run_s"]
            start = "never" if first is None else f"{first / 3600:.1f}"
            cells.append(f"{figures['wait_s'] / 3600:.1f} ({start})")
        table.add_row(job, *cells)
    return table


def simulate(
    cluster: FileArg,
    jobs: FileArg,
    out: Annotated[Path, typer.Option(help="Directory for the summary, timelines and plots.")],
    trace: Annotated[Path | None, typer.Option(help="CSV: time_s,node,category,repair_s.")] = None,
    generate: Annotated[bool, typer.Option(help="Draw a trace from the paper's mix.")] = False,
    rate: Annotated[float, typer.Option(help="Failures per GPU-hour for --generate.")] = (
        LLAMA3_FAILURES_PER_GPU_H
    ),
    days: Annotated[float, typer.Option(help="Simulated days.")] = 30.0,
    seed: Annotated[int, typer.Option(help="Seed of the generated trace.")] = 0,
    repair_hours: Annotated[float, typer.Option(help="Mean SEV1 repair (generated).")] = 4.0,
    policy: Annotated[str, typer.Option(help=f"One of {', '.join(NAMES)}, or all.")] = "all",
    calibration: Annotated[
        Path | None, typer.Option(help="Planner calibration JSON (transition factors, rate).")
    ] = None,
    sample_minutes: Annotated[float, typer.Option(help="Timeline sample period.")] = 15.0,
    measured_plan_time: Annotated[
        bool, typer.Option(help="Charge the planner's measured time (not reproducible).")
    ] = False,
    baseline_allocation: Annotated[
        str, typer.Option(help="Baselines start from Unicron's plan ('planner') or 'fifo'.")
    ] = "planner",
    fairness: Annotated[
        Fairness, typer.Option(help="The planner's policy against starvation.")
    ] = Fairness.WAF,
    aging_hours: Annotated[
        float, typer.Option(help="aging: hours of waiting that double a job's weight.")
    ] = 24.0,
    baseline_throughput: Annotated[
        list[str] | None,
        typer.Option(
            help="POLICY=FACTOR: a policy's measured failure-free throughput over Megatron's "
            "(the planner's model), replacing its mechanism's figure. Repeatable."
        ),
    ] = None,
) -> None:
    """Simulate a cluster under a failure trace and compare recovery policies by WAF."""
    console = Console(highlight=False)
    if (trace is None) == (not generate):
        _refuse("give exactly one of --trace FILE and --generate")
    if baseline_allocation not in ("planner", "fifo"):
        _refuse("--baseline-allocation must be planner or fifo")
    names = list(NAMES) if policy == "all" else [policy]
    if any(n not in NAMES for n in names):
        _refuse(f"unknown policy {policy!r}; known: {', '.join(NAMES)}, all")
    try:
        throughput = parse_throughput(baseline_throughput or [])
    except ValueError as exc:
        _refuse(str(exc))
    if not 0 < aging_hours < float("inf"):
        _refuse("--aging-hours must be a positive number")
    rules = PlanRules(fairness, aging_hours * 3600.0)
    try:
        scenario = build_scenario(
            cluster,
            jobs,
            days,
            trace,
            rate,
            seed,
            repair_hours,
            calibration,
            Options(sample_minutes, measured_plan_time, baseline_allocation, throughput, rules),
        )
    except InputError as exc:
        _refuse(str(exc))
    config, failures = scenario.cluster, scenario.trace
    out.mkdir(parents=True, exist_ok=True)
    if generate:
        write_trace(out / "trace.csv", failures)
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        tasks = {n: bar.add_task(f"{n:8s}", total=scenario.duration_s) for n in names}

        def progress(name: str, done: float) -> None:
            bar.update(tasks[name], completed=done)

        summary, results = run_all(scenario, names, progress)
        for n in names:
            bar.update(tasks[n], completed=scenario.duration_s)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for r in results:
        r.timeline.write_csv(out / f"timeline-{r.policy}.csv")
    title = f"{config.gpus} GPUs, {len(failures)} failures in {days:g} days"
    plot_waf([r.timeline for r in results], out / "waf.png", title)
    plot_gpus([r.timeline for r in results], out / "gpus.png")
    console.print(_table(summary))
    console.print(waiting_table(summary))
    ratio = summary["ratio_unicron_to_best_baseline"]
    if ratio is not None:
        console.print(f"unicron / best baseline: {ratio:.3f}x")
    console.print(f"wrote {out}/summary.json, waf.png, gpus.png, timeline-*.csv")


def _refuse(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_REFUSED)


if __name__ == "__main__":
    typer.run(simulate)
