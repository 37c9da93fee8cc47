"""Explanations: what each job gets, what it costs, and the best alternatives that lost.

For each job the explanation records the docs/design.md §4 terms of the chosen count (T, WAF,
predicted downtime, G) and, for a few telling alternatives — no workers, one or two units
fewer or more, what it holds now, its smallest and largest feasible counts, its best count on
its own — the expected reward of the best whole-cluster plan that makes that choice under the
same rules (:func:`.quotas.alternatives`, exact), so "why not more?" is answered with a number.
"""

from __future__ import annotations

import numpy as np
from unicron.planning.api import KINDS, SOURCES, Curve, FloatArray, IntArray
from unicron.planning.objective import JobTerms
from unicron.shared.contracts.plans import Alternative, JobExplanation, ParallelConfig

SHOWN = 3  # alternatives kept per job, best first


def config(curve: Curve, i: int) -> ParallelConfig | None:
    """The configuration behind entry ``i`` of a curve; None where nothing runs."""
    if curve.flops[i] <= 0:
        return None
    step = float(curve.iteration_s[i])
    return ParallelConfig(
        tp=int(curve.tp[i]),
        pp=int(curve.pp[i]),
        dp=int(curve.dp[i]),
        micro_batch=int(curve.micro_batch[i]),
        iteration_s=step if np.isfinite(step) else None,
    )


def candidates(terms: JobTerms, chosen: int, keep: int) -> IntArray:
    """The unit counts worth comparing with the chosen one (feasible, chosen left out)."""
    feasible = np.flatnonzero(np.isfinite(terms.rewards))
    picks = {0, chosen - 2, chosen - 1, chosen + 1, chosen + 2, keep}
    if feasible.size:
        picks |= {int(feasible[-1]), int(np.argmax(terms.rewards))}
    if feasible.size > 1:  # its minimum: what a waiting job would start on
        picks.add(int(feasible[1]))
    allowed = set(feasible.tolist())
    return np.array(sorted(k for k in picks if k != chosen and k in allowed), dtype=np.int64)


def explain(
    terms: JobTerms, units: int, ks: IntArray, totals: FloatArray, best_total: float
) -> JobExplanation:
    curve, moves, demand = terms.curve, terms.moves, terms.demand
    flops = float(curve.flops[units])
    return JobExplanation(
        old_workers=demand.old_workers,
        new_workers=terms.workers(units),
        old_config=config(terms.old, 0),
        new_config=config(curve, units),
        weight=demand.weight,
        predicted_throughput_old=float(terms.old.flops[0]),
        predicted_throughput=flops,
        predicted_waf=demand.weight * flops,
        calibration=demand.slowdown,
        transition=KINDS[int(moves.kind[units])].value,
        state_source=SOURCES[int(moves.source[units])].value,
        predicted_downtime_s=float(moves.downtime_s[units]),
        predicted_lost_work_s=float(moves.lost_s[units]),
        downtime_factor=float(moves.factor[units]),
        reward=float(terms.rewards[units]),
        alternatives=_alternatives(terms, ks, totals, best_total),
    )


def _alternatives(
    terms: JobTerms, ks: IntArray, totals: FloatArray, best_total: float
) -> list[Alternative]:
    order = [i for i in np.argsort(-totals, kind="stable") if np.isfinite(totals[i])]
    shown = []
    for i in order[:SHOWN]:
        k = int(ks[i])
        shown.append(
            Alternative(
                workers=terms.workers(k),
                config=config(terms.curve, k),
                predicted_throughput=float(terms.curve.flops[k]),
                reward=float(terms.rewards[k]),
                plan_reward=float(totals[i]),
                shortfall=max(0.0, best_total - float(totals[i])),
            )
        )
    return shown
