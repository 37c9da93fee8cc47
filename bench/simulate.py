"""Simulator sweep: Unicron against the baselines as the per-GPU failure rate grows.

``python bench/simulate.py`` (defaults: rates 2.2e-5 1.6e-3 5e-3 1.5e-2, seeds 1 2 3, 30 days).
For each rate and seed it draws a trace of the paper's failure mix at that rate (failures per
GPU-hour) on the 128-GPU example (``examples/sim/cluster-128.json`` and ``jobs-128.json``) and
runs every policy of ``unicron simulate`` over it — the same scenario the CLI builds with
``--generate --rate R --seed S --days D`` (:mod:`simulator.scenario`), the same event loop
(:func:`simulator.runner.run_all`). 2.2e-5 is the Llama 3 rate (466 interruptions in 54 days
on 16,384 GPUs: about 2 failures in 30 days here); 1.6e-3 is about 5 a day on 128 GPUs.

Per rate it reports the failures per simulated day, each policy's accumulated WAF (weighted
FLOPs, shown in w·ZFLOP) and ETTR as means over the seeds, Unicron's accumulated WAF over each
baseline's and over the best baseline's of the same seed (min and mean over the seeds; above 1
means Unicron did more weighted work), and the wall time of the rate's runs. The runs are
deterministic (the planner's modelled time is charged, not its measured time), so only the
wall times change between two runs of the benchmark.

Prints two tables, then as its last line one JSON object:
``{"days": 30.0, "gpus": 128, "seeds": [1, 2, 3], "rates": {"2.2e-05": {"failures_per_day": …,
"accumulated_waf": {policy: …}, "ettr": {policy: …}, "ratio_unicron_to": {"restart": {"min": …,
"mean": …}, …, "best": {…}}, "wall_s": …}, …}, "wall_s": …}``. ``--out FILE`` also writes that
object, with every run's full summary under ``"runs"``.
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


@dataclass(frozen=True)
class Point:
    """One rate of the sweep: means and ratio statistics over its seeds."""

    rate: float
    failures_per_day: float
    waf: dict[str, float]  # policy -> mean accumulated WAF
    ettr: dict[str, float]  # policy -> mean ETTR
    ratios: dict[str, dict[str, float | None]]  # baseline or "best" -> {"min", "mean"}
    wall_s: float
    runs: list[dict[str, Any]]  # every seed's summary, as run_all returns it

    def document(self) -> dict[str, Any]:
        return {
            "failures_per_day": round(self.failures_per_day, 3),
            "accumulated_waf": {k: round(v, -15) for k, v in self.waf.items()},
            "ettr": {k: round(v, 4) for k, v in self.ettr.items()},
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

    return Point(
        rate=rate,
        failures_per_day=_over([r["policies"]["unicron"]["failures"] / days for r in runs]),
        waf={n: mean_of("accumulated_waf", n) for n in NAMES},
        ettr={n: mean_of("ettr", n) for n in NAMES},
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
    for header in ("rate", "policy", "acc. WAF (w·ZFLOP)", "ETTR", "u/p min", "u/p mean"):
        table.add_column(header, justify="right")
    for p in points:
        for name in NAMES:
            r = p.ratios.get(name, {"min": None, "mean": None})  # none for unicron itself
            table.add_row(f"{p.rate:g}" if name == NAMES[0] else "", name,
                          f"{p.waf[name] / ZFLOP:.2f}", f"{p.ettr[name]:.3f}",
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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
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
