"""The reward G(t, x) of DESIGN.md §4, evaluated for every job and every unit count.

    G(t, x) = w·T(t, x)·D_run - [x ≠ x_old or t was hit]·w·T(t, x_old)·D_trans(t, x_old → x)

The bracket lives in the :class:`~services.planner.api.TransitionCost` (it returns 0 where
nothing changes), so a calibrated cost model decides what counts as a change. Infeasible
counts (between 0 and min, above max) get -inf so the DP never picks them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from services.planner import dp
from services.planner.api import FloatArray, IntArray, JobDemand, Objective


def job_rewards(demand: JobDemand, workers: IntArray, objective: Objective) -> FloatArray:
    """G(t, x) for each worker count in ``workers``."""
    w = demand.weight
    run = w * objective.throughput.throughput(demand, workers) * objective.run_s
    old = np.array([demand.current], dtype=np.int64)
    old_rate = float(objective.throughput.throughput(demand, old)[0])
    lost = w * old_rate * objective.cost.downtime(demand, workers)
    return np.where(demand.feasible(workers), run - lost, -np.inf)


def reward_matrix(demands: Sequence[JobDemand], capacity: int, objective: Objective) -> FloatArray:
    """G for each job (rows) and each number of units 0..capacity // unit (columns)."""
    units = np.arange(capacity // objective.unit + 1, dtype=np.int64)
    workers = units * objective.unit
    rows = [job_rewards(d, workers, objective) for d in demands]
    return np.vstack(rows) if rows else np.zeros((0, units.size), dtype=np.float64)


def allocate(demands: Sequence[JobDemand], capacity: int, objective: Objective) -> list[int]:
    """Workers for each job (in the given order: earlier wins ties) maximising Σ G."""
    unit = objective.unit
    keep = [
        d.current // unit if d.current > 0 and d.current % unit == 0 else dp.NO_KEEP
        for d in demands
    ]
    units = dp.solve(reward_matrix(demands, capacity, objective), keep)
    return [int(k) * unit for k in units]


def value(demands: Sequence[JobDemand], workers: Sequence[int], objective: Objective) -> float:
    """Σ G of an allocation (for explanations and tests)."""
    total = 0.0
    for demand, x in zip(demands, workers, strict=True):
        total += float(job_rewards(demand, np.array([x], dtype=np.int64), objective)[0])
    return total
