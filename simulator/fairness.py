"""The planner's fairness policies compared on one scenario: what each costs in WAF and what it
saves in waiting (``bench/simulate.py --fairness``; planning/fairness.py).

:data:`STARVED_JOBS` is the starvation case of issue 11: six jobs of different weights and
minimums on the 128-GPU example cluster, where pure WAF maximisation gives all 128 GPUs to
the two highest-weight jobs for the whole run and the other four never start. Each policy runs
Unicron (the recovery policy) over the same drawn traces; a job's waiting is the time it was
admitted but held no GPUs (:attr:`unicron.simulator.state.JobRun.wait_s`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from unicron.planning.fairness import PlanRules
from unicron.shared.contracts.plans import Fairness
from unicron.simulator.inputs import JobConfig
from unicron.simulator.runner import run_policy
from unicron.simulator.scenario import Inputs, Options, generated_scenario

STARVED_JOBS = (
    JobConfig("llm-a", 13.0, 3.0, 32, 64),
    JobConfig("llm-b", 6.7, 2.0, 16, 64),
    JobConfig("llm-c", 6.7, 1.0, 16, 32),
    JobConfig("llm-d", 2.7, 0.8, 8, 32),
    JobConfig("llm-e", 1.3, 0.6, 8, 16),
    JobConfig("llm-f", 13.0, 0.5, 32, 48),
)
HOUR = 3600.0


def label(rules: PlanRules) -> str:
    """A policy's name in tables: aging carries its doubling time."""
    if rules.fairness == Fairness.AGING:
        return f"aging {rules.aging_s / HOUR:g}h"
    return str(rules.fairness.value)


@dataclass(frozen=True)
class Outcome:
    """One policy over the seeds: WAF and, per job, waiting and first start (means, hours)."""

    label: str
    rules: PlanRules
    accumulated_waf: float
    wait_h: dict[str, float]
    first_run_h: dict[str, float | None]  # None: it never ran in some seed
    changes: float  # a job's allocation changed by a plan, per run (starts included)

    def document(self, reference: float) -> dict[str, Any]:
        return {
            "fairness": self.rules.fairness.value,
            "aging_h": self.rules.aging_s / HOUR if self.rules.fairness == Fairness.AGING else None,
            "accumulated_waf": round(self.accumulated_waf, -15),
            "relative_waf": round(self.accumulated_waf / reference, 4) if reference else None,
            "wait_h": {k: round(v, 1) for k, v in self.wait_h.items()},
            "first_run_h": {k: _rounded(v) for k, v in self.first_run_h.items()},
            "changes": self.changes,
        }


def _rounded(hours: float | None) -> float | None:
    return None if hours is None else round(hours, 1)


def outcome(
    inputs: Inputs, rules: PlanRules, rate: float, days: float, seeds: list[int]
) -> Outcome:
    """Unicron under ``rules`` over one drawn trace per seed."""
    summaries = []
    for seed in seeds:
        options = Options(sample_minutes=60.0, rules=rules)
        scenario = generated_scenario(inputs, rate, days, seed, options=options)
        summaries.append(run_policy(scenario, "unicron").summary)
    names = [j.name for j in inputs.jobs]

    def first(name: str) -> float | None:
        starts = [s["jobs"][name]["first_run_s"] for s in summaries]
        return None if None in starts else statistics.fmean(starts) / HOUR

    return Outcome(
        label(rules),
        rules,
        statistics.fmean(s["accumulated_waf"] for s in summaries),
        {n: statistics.fmean(s["jobs"][n]["wait_s"] for s in summaries) / HOUR for n in names},
        {n: first(n) for n in names},
        statistics.fmean(s["allocation_changes"] for s in summaries),
    )


def compare(
    inputs: Inputs, rules: list[PlanRules], rate: float, days: float, seeds: list[int]
) -> list[Outcome]:
    """Each of ``rules`` over the same traces; the first is the reference (pure WAF)."""
    return [outcome(inputs, r, rate, days, seeds) for r in rules]
