"""The reward G(t, x) of docs/design.md §4, evaluated for every job and every unit count.

    G(t, x) = w·T(t, x)·D_run - [x ≠ x_old or t was hit]·w·T(t, x_old)·D_trans(t, x_old → x)

The bracket lives in the :class:`~unicron.planning.api.TransitionCost` (it returns 0 where
nothing changes), so the cost model decides what counts as a change. The DP hands out ``unit``
slots at a time; k units give a job min(k·unit, max) workers, so a job smaller than a node still
fits. Infeasible counts (below min, a whole unit past max, or where no configuration runs) get
-inf so the DP never picks them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import numpy.typing as npt
from unicron.planning import dp
from unicron.planning.api import (
    Curve,
    FloatArray,
    IntArray,
    JobDemand,
    Objective,
    Transitions,
)


@dataclass(frozen=True)
class JobTerms:
    """Everything G was made of for one job: its curve, its transitions and the rewards."""

    demand: JobDemand
    curve: Curve  # for 0..n units
    old: Curve  # at x_old
    moves: Transitions
    rewards: FloatArray  # G per unit count; -inf where infeasible

    def workers(self, units: int) -> int:
        return int(self.curve.workers[units])


def unit_feasible(demand: JobDemand, units: IntArray, unit: int) -> npt.NDArray[np.bool_]:
    """0 units, or enough units for the minimum and none wholly past the maximum."""
    enough = units * unit >= demand.min_workers
    not_past = (units - 1) * unit < demand.max_workers
    feasible: npt.NDArray[np.bool_] = (units == 0) | (enough & not_past)
    return feasible


def _curve(demand: JobDemand, units: IntArray, objective: Objective) -> Curve:
    """T on min(k·unit, max) workers: the plain grid is what the model caches across jobs."""
    model, unit = objective.throughput, objective.unit
    grid = units * unit
    curve = model.curve(demand, grid)
    past = grid > demand.max_workers
    if unit == 1 or not past.any():
        return curve
    top = model.curve(demand, np.array([demand.max_workers], dtype=np.int64))
    fields = ("workers", "flops", "iteration_s", "tp", "pp", "dp", "micro_batch")
    clipped = [np.where(past, getattr(top, f)[0], getattr(curve, f)) for f in fields]
    return Curve(*clipped)


def job_terms(demand: JobDemand, units: IntArray, objective: Objective) -> JobTerms:
    """G(t, x) for each unit count in ``units``, with the terms behind it."""
    curve = _curve(demand, units, objective)
    feasible = unit_feasible(demand, units, objective.unit)
    return _rewards(demand, _parts(demand, curve, feasible, objective), objective.run_s)


@dataclass(frozen=True)
class _Parts:
    """What G is made of, apart from D_run: the part worth keeping from plan to plan."""

    curve: Curve
    old: Curve
    moves: Transitions
    feasible: npt.NDArray[np.bool_]

    def head(self, size: int) -> _Parts:
        cut = [np.asarray(getattr(self.curve, f))[:size] for f in CURVE_FIELDS]
        moves = [np.asarray(getattr(self.moves, f))[:size] for f in MOVE_FIELDS]
        return _Parts(Curve(*cut), self.old, Transitions(*moves), self.feasible[:size])


CURVE_FIELDS = ("workers", "flops", "iteration_s", "tp", "pp", "dp", "micro_batch")
MOVE_FIELDS = ("kind", "source", "downtime_s", "lost_s", "factor")
GRID_STEP = 64  # cached grids grow in steps, so a lost or joined node keeps the cache


def _parts(
    demand: JobDemand, curve: Curve, feasible: npt.NDArray[np.bool_], objective: Objective
) -> _Parts:
    old = objective.throughput.curve(demand, np.array([demand.old_workers], dtype=np.int64))
    moves = objective.cost.transitions(demand, old, curve)
    runs = (curve.workers == 0) | (curve.flops > 0)
    return _Parts(curve, old, moves, feasible & runs)


# About 60 kB an entry at 4,096 GPUs: room for four plans' worth of 128 changed jobs.
@lru_cache(maxsize=512)
def _cached_parts(demand: JobDemand, count: int, objective: Objective) -> _Parts:
    units = np.arange(count + 1, dtype=np.int64)
    curve = _curve(demand, units, objective)
    return _parts(demand, curve, unit_feasible(demand, units, objective.unit), objective)


def _rewards(demand: JobDemand, parts: _Parts, run_s: float) -> JobTerms:
    w = demand.weight
    run = w * parts.curve.flops * run_s
    lost = w * float(parts.old.flops[0]) * parts.moves.total_s
    rewards = np.where(parts.feasible, run - lost, -np.inf)
    return JobTerms(demand, parts.curve, parts.old, parts.moves, rewards)


def grid_terms(demand: JobDemand, count: int, objective: Objective) -> JobTerms:
    """:func:`job_terms` for 0..count units. Everything but D_run is cached per job on a
    grid a little larger than needed, so a re-plan after a job event, a failure-rate update
    or a lost node recomputes only the jobs that changed — usually none but one."""
    size = -(-(count + 1) // GRID_STEP) * GRID_STEP
    try:
        parts = _cached_parts(demand, size - 1, replace(objective, run_s=0.0)).head(count + 1)
    except TypeError:  # a model that is not hashable: compute afresh
        return job_terms(demand, np.arange(count + 1, dtype=np.int64), objective)
    return _rewards(demand, parts, objective.run_s)


def all_terms(demands: Sequence[JobDemand], capacity: int, objective: Objective) -> list[JobTerms]:
    count = capacity // objective.unit
    return [grid_terms(d, count, objective) for d in demands]


def reward_matrix(demands: Sequence[JobDemand], capacity: int, objective: Objective) -> FloatArray:
    """G for each job (rows) and each number of units 0..capacity // unit (columns)."""
    return stack(all_terms(demands, capacity, objective), capacity // objective.unit + 1)


def stack(terms: Sequence[JobTerms], width: int) -> FloatArray:
    rows = [t.rewards for t in terms]
    return np.vstack(rows) if rows else np.zeros((0, width), dtype=np.float64)


def keep_units(terms: Sequence[JobTerms]) -> list[int]:
    """The unit count at which each job keeps exactly what it holds (DP tie-break)."""
    keep = []
    for t in terms:
        held = t.demand.current
        match = np.flatnonzero(t.curve.workers == held) if held > 0 else np.array([])
        keep.append(int(match[0]) if match.size else dp.NO_KEEP)
    return keep


def allocate(demands: Sequence[JobDemand], capacity: int, objective: Objective) -> list[int]:
    """Workers for each job (in the given order: earlier wins ties) maximising Σ G."""
    terms = all_terms(demands, capacity, objective)
    units = dp.solve(stack(terms, capacity // objective.unit + 1), keep_units(terms))
    return [t.workers(int(k)) for t, k in zip(terms, units, strict=True)]


def value(demands: Sequence[JobDemand], workers: Sequence[int], objective: Objective) -> float:
    """Σ G of an allocation given in workers (for explanations and tests)."""
    total = 0.0
    for demand, x in zip(demands, workers, strict=True):
        count = np.array([x], dtype=np.int64)
        curve = objective.throughput.curve(demand, count)
        parts = _parts(demand, curve, demand.feasible(count), objective)
        total += float(_rewards(demand, parts, objective.run_s).rewards[0])
    return total
