"""Simulator sweep: Unicron against the baselines as the per-GPU failure rate grows.

``python bench/simulate.py`` (defaults: rates 2.2e-5 1.6e-3 5e-3 1.5e-2, seeds 1 2 3, 30 days).
For each rate and seed it draws a trace of the paper's failure mix at that rate (failures per
GPU-hour) on the 128-GPU example (``examples/sim/cluster-128.json`` and ``jobs-128.json``) and
runs every policy of ``unicron simulate`` over it — the same scenario the CLI builds with
``--generate --rate R --seed S --days D`` (:mod:`unicron.simulator.scenario`), the same event loop
(:func:`unicron.simulator.runner.run_all`). 2.2e-5 is the Llama 3 rate (466 interruptions in 54 days
on 16,384 GPUs: about 2 failures in 30 days here); 1.6e-3 is about 5 a day on 128 GPUs.

Per rate it reports the failures per simulated day, each policy's accumulated WAF (weighted
FLOPs, shown in w·ZFLOP) and ETTR as means over the seeds, Unicron's accumulated WAF over each
baseline's and over the best baseline's of the same seed (min and mean over the seeds; above 1
means Unicron did more weighted work), and the wall time of the rate's runs. The runs are
deterministic (the planner's modelled time is charged, not its measured time), so only the
wall times change between two runs of the benchmark.

Prints two tables, then as its last line one JSON object:
``{"days": 30.0, "gpus": 128, "seeds": [1, 2, 3], "rates": {"2.2e-05": {"failures_per_day": …,
"accumulated_waf": {policy: …}, "ettr": {policy: …}, "wait_h": {policy: {job: …}},
"ratio_unicron_to": {"restart": {"min": …, "mean": …}, …, "best": {…}}, "wall_s": …}, …},
"wall_s": …}`` (``wait_h``: each job's hours admitted without GPUs, mean over the seeds).
``--out FILE`` also writes that object, with every run's full summary under ``"runs"``.

``--fairness`` compares the planner's policies against starvation instead
(:mod:`unicron.simulator.fairness`): the six-job starvation scenario on the 128-GPU cluster
(``--jobs`` for another), Unicron under ``waf``, ``guaranteed_min`` and ``aging`` for each
``--aging-hours``, at the first ``--rates`` value. It prints each policy's accumulated WAF
relative to ``waf``, its allocation changes, and each job's waiting and first start, then
``{"fairness": [{"fairness": …, "aging_h": …, "relative_waf": …, "wait_h": {job: …},
"first_run_h": {job: …}, …}, …], "days": …, "rate": …, "seeds": […], "wall_s": …}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from unicron.planning.fairness import PlanRules
from unicron.shared.contracts.plans import Fairness
from unicron.simulator.fairness import STARVED_JOBS, Outcome, compare
from unicron.simulator.inputs import load_cluster
from unicron.simulator.metrics import ratio
from unicron.simulator.policies import BASELINES, NAMES
from unicron.simulator.runner import run_all
from unicron.simulator.scenario import Inputs, generated_scenario, load_inputs

ROOT = Path(__file__).resolve().parents[1]
RATES = (2.2e-5, 1.6e-3, 5e-3, 1.5e-2)
SEEDS = (1, 2, 3)
DAYS = 30.0
CLUSTER = ROOT / "examples/sim/cluster-128.json"
JOBS = ROOT / "examples/sim/jobs-128.json"
ZFLOP = 1e21
AGING_HOURS = (24.0, 72.0, 168.0)


@dataclass(frozen=True)
class Point:
    """One rate of the sweep: means and ratio statistics over its seeds."""

    rate: float
    failures_per_day: float
    waf: dict[str, float]  # policy -> mean accumulated WAF
    ettr: dict[str, float]  # policy -> mean ETTR
    wait_h: dict[str, dict[str, float]]  # policy -> job -> mean hours admitted without GPUs
    ratios: dict[str, dict[str, float | None]]  # baseline or "best" -> {"min", "mean"}
    wall_s: float
    runs: list[dict[str, Any]]  # every seed's summary, as run_all returns it

    def document(self) -> dict[str, Any]:
        return {
            "failures_per_day": round(self.failures_per_day, 3),
            "accumulated_waf": {k: round(v, -15) for k, v in self.waf.items()},
            "ettr": {k: round(v, 4) for k, v in self.ettr.items()},
            "wait_h": {p: {j: round(h, 1) for j, h in w.items()} for p, w in self.wait_h.items()},
            "ratio_unicron_to": self.ratios,
            "wall_s": round(self.wall_s, 2),
        }


def _over(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _stats(values: list[float | None]) -> dict[str, float | None]:
    """Min and mean over the seeds; None when a seed had no ratio (a baseline did no work)."""
    if not values or any(v is None for v in values):
        return {"min": None, "mean": None}
    known = [v for v in values if v is not None]
    return {"min": round(min(known), 4), "mean": round(statistics.fmean(known), 4)}


def unicron_ratios(policies: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Unicron's accumulated WAF over each baseline's and (``best``) the best baseline's."""
    top = policies["unicron"]["accumulated_waf"]
    out: dict[str, float | None] = {}
    for name in BASELINES:
        other = policies[name]["accumulated_waf"]
        out[name] = top / other if other > 0 else None
    out["best"] = ratio(policies)
    return out


def run_rate(inputs: Inputs, rate: float, seeds: list[int], days: float) -> Point:
    """Every policy over one drawn trace per seed, summarised over the seeds."""
    started = time.perf_counter()
    runs = [run_all(generated_scenario(inputs, rate, days, s), NAMES)[0] for s in seeds]
    wall = time.perf_counter() - started
    per_seed = [unicron_ratios(r["policies"]) for r in runs]

    def mean_of(key: str, name: str) -> float:
        return _over([float(r["policies"][name][key]) for r in runs])

    def waits(name: str) -> dict[str, float]:
        jobs = runs[0]["policies"][name]["jobs"]
        return {j: _over([r["policies"][name]["jobs"][j]["wait_s"] / 3600 for r in runs])
                for j in jobs}  # fmt: skip

    return Point(
        rate=rate,
        failures_per_day=_over([r["policies"]["unicron"]["failures"] / days for r in runs]),
        waf={n: mean_of("accumulated_waf", n) for n in NAMES},
        ettr={n: mean_of("ettr", n) for n in NAMES},
        wait_h={n: waits(n) for n in NAMES},
        ratios={k: _stats([s[k] for s in per_seed]) for k in (*BASELINES, "best")},
        wall_s=wall,
        runs=[{"seed": s, **r} for s, r in zip(seeds, runs, strict=True)],
    )


def sweep(inputs: Inputs, rates: list[float], seeds: list[int], days: float) -> list[Point]:
    """The benchmark's measurements: one :class:`Point` per rate, in the order given."""
    return [run_rate(inputs, rate, seeds, days) for rate in rates]


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def rate_table(points: list[Point], seeds: int, days: float, gpus: int) -> Table:
    table = Table(title=f"unicron / best baseline, {seeds} seed(s) x {days:g} days, {gpus} GPUs")
    for header in ("rate /GPU-h", "failures/day", "min", "mean", "wall s"):
        table.add_column(header, justify="right")
    for p in points:
        best = p.ratios["best"]
        table.add_row(f"{p.rate:g}", f"{p.failures_per_day:.2f}", _x(best["min"]),
                      _x(best["mean"]), f"{p.wall_s:.1f}")  # fmt: skip
    return table


def policy_table(points: list[Point]) -> Table:
    table = Table(title="per policy (means over seeds); unicron / policy, min and mean")
    for header in ("rate", "policy", "acc. WAF (w·ZFLOP)", "ETTR", "waiting (job-h)", "u/p min",
                   "u/p mean"):  # fmt: skip
        table.add_column(header, justify="right")
    for p in points:
        for name in NAMES:
            r = p.ratios.get(name, {"min": None, "mean": None})  # none for unicron itself
            table.add_row(f"{p.rate:g}" if name == NAMES[0] else "", name,
                          f"{p.waf[name] / ZFLOP:.2f}", f"{p.ettr[name]:.3f}",
                          f"{sum(p.wait_h[name].values()):.0f}",
                          _x(r["min"]), _x(r["mean"]))  # fmt: skip
        table.add_section()
    return table


def document(points: list[Point], seeds: list[int], days: float, gpus: int) -> dict[str, Any]:
    return {
        "days": days,
        "gpus": gpus,
        "seeds": seeds,
        "rates": {f"{p.rate:g}": p.document() for p in points},
        "wall_s": round(sum(p.wall_s for p in points), 2),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--rates", type=float, nargs="+", default=list(RATES),
                        help="failures per GPU-hour (default: %(default)s)")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS),
                        help="trace seeds (default: %(default)s)")  # fmt: skip
    parser.add_argument("--days", type=float, default=DAYS, help="simulated days")
    parser.add_argument("--cluster", type=Path, default=CLUSTER, help="cluster JSON")
    parser.add_argument("--jobs", type=Path, default=JOBS, help="jobs JSON")
    parser.add_argument("--out", type=Path, help="also write the JSON (with every run) here")
    parser.add_argument("--fairness", action="store_true",
                        help="compare the planner's policies against starvation")  # fmt: skip
    parser.add_argument("--aging-hours", type=float, nargs="+", default=list(AGING_HOURS),
                        help="aging policies to compare (default: %(default)s)")  # fmt: skip
    return parser.parse_args(argv)


def fairness_table(outcomes: list[Outcome]) -> Table:
    table = Table(title="planner fairness: accumulated WAF and allocation changes per run")
    for header in ("policy", "acc. WAF (w·ZFLOP)", "vs waf", "changes"):
        table.add_column(header, justify="right")
    top = outcomes[0].accumulated_waf if outcomes else 0.0
    for o in outcomes:
        share = f"{o.accumulated_waf / top:.3f}" if top else "-"
        table.add_row(o.label, f"{o.accumulated_waf / ZFLOP:.2f}", share, f"{o.changes:.0f}")
    return table


def waiting_table(outcomes: list[Outcome]) -> Table:
    table = Table(title="hours each job waited (first start, h)")
    table.add_column("job")
    for o in outcomes:
        table.add_column(o.label, justify="right")
    for name in outcomes[0].wait_h if outcomes else []:
        cells = [f"{o.wait_h[name]:.0f} ({_hours(o.first_run_h[name])})" for o in outcomes]
        table.add_row(name, *cells)
    return table


def _hours(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f}"


def run_fairness(args: argparse.Namespace) -> None:
    """``--fairness``: the policies against starvation on one scenario (module docstring)."""
    cluster = load_cluster(args.cluster)
    starved = args.jobs == JOBS  # the default jobs file: the starvation scenario instead
    inputs = (
        Inputs(cluster, list(STARVED_JOBS)) if starved else load_inputs(args.cluster, args.jobs)
    )
    rules = [PlanRules(), PlanRules(Fairness.GUARANTEED_MIN)]
    rules += [PlanRules(Fairness.AGING, h * 3600.0) for h in args.aging_hours]
    started = time.perf_counter()
    outcomes = compare(inputs, rules, args.rates[0], args.days, args.seeds)
    wall = time.perf_counter() - started
    console = Console(highlight=False)
    console.print(fairness_table(outcomes))
    console.print(waiting_table(outcomes))
    top = outcomes[0].accumulated_waf
    doc = {
        "fairness": [o.document(top) for o in outcomes],
        "days": args.days,
        "rate": args.rates[0],
        "seeds": args.seeds,
        "gpus": cluster.gpus,
        "wall_s": round(wall, 2),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc))


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.fairness:
        run_fairness(args)
        return
    inputs = load_inputs(args.cluster, args.jobs)
    points = sweep(inputs, args.rates, args.seeds, args.days)
    console = Console(highlight=False)
    console.print(rate_table(points, len(args.seeds), args.days, inputs.cluster.gpus))
    console.print(policy_table(points))
    doc = document(points, args.seeds, args.days, inputs.cluster.gpus)
    if args.out:
        runs = [{"rate": p.rate, **run} for p in points for run in p.runs]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**doc, "runs": runs}, indent=2) + "\n")
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
