"""Timelines and the summary of a run.

A sample every ``sample_s`` records, per policy: the instantaneous WAF (Σ weight x achieved
FLOP/s over the jobs that are up), the accumulated WAF (∫ WAF dt, in weighted FLOPs) and the
GPUs each job holds. The summary per policy: ``accumulated_waf``; ``ettr`` (effective training
time ratio: the time jobs trained over the time they held GPUs — recovery counts against it,
waiting for GPUs is reported apart as ``wait_s``, in all and per job in ``jobs``: the time each
was admitted but held no GPUs, and when it first ran); ``failures`` (trace failures during the
run); ``downtime_s`` (job-seconds spent recovering).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unicron.simulator.state import JobRun, Simulation


@dataclass
class Timeline:
    policy: str
    jobs: list[str]
    time_s: list[float] = field(default_factory=list)
    waf: list[float] = field(default_factory=list)
    accumulated: list[float] = field(default_factory=list)
    gpus: list[list[int]] = field(default_factory=list)  # per sample, per job

    def sample(self, sim: Simulation) -> None:
        now = sim.now
        runs = [sim.jobs[j] for j in self.jobs]
        self.time_s.append(now)
        self.waf.append(sum(r.config.weight * r.flops for r in runs if r.up(now)))
        self.accumulated.append(sum(r.acc_waf for r in runs))
        self.gpus.append([r.workers if r.arrived and not r.done else 0 for r in runs])

    def write_csv(self, path: Path) -> None:
        with path.open("w", newline="") as handle:
            out = csv.writer(handle)
            out.writerow(["time_s", "waf", "accumulated_waf", *(f"gpus:{j}" for j in self.jobs)])
            for t, w, a, g in zip(self.time_s, self.waf, self.accumulated, self.gpus, strict=True):
                out.writerow([f"{t:g}", f"{w:.6g}", f"{a:.6g}", *g])


def policy_summary(
    sim: Simulation, failures: int, policy_stats: dict[str, float]
) -> dict[str, Any]:
    runs = list(sim.jobs.values())
    useful = sum(r.useful_s for r in runs)
    present = useful + sum(r.down_s for r in runs)
    return {
        "accumulated_waf": sum(r.acc_waf for r in runs),
        "ettr": useful / present if present else 0.0,
        "failures": failures,
        "downtime_s": sum(r.down_s for r in runs),
        "wait_s": sum(r.wait_s for r in runs),
        "jobs": {r.name: job_summary(r) for r in runs},
        "job_hits": sum(r.hits for r in runs),
        "finished": sorted(r.name for r in runs if r.done),
        **{k: v for k, v in policy_stats.items() if k != "job_hits"},
    }


def job_summary(run: JobRun) -> dict[str, Any]:
    """One job's figures: its waiting (admitted, no GPUs), its first start, its weighted work."""
    return {
        "wait_s": run.wait_s,
        "first_run_s": run.first_run_s,
        "accumulated_waf": run.acc_waf,
        "finished": run.done,
    }


def ratio(policies: dict[str, dict[str, Any]]) -> float | None:
    """Unicron's accumulated WAF over the best baseline's (None without both)."""
    if "unicron" not in policies:
        return None
    others = [p["accumulated_waf"] for name, p in policies.items() if name != "unicron"]
    best = max(others, default=0.0)
    return policies["unicron"]["accumulated_waf"] / best if best > 0 else None
