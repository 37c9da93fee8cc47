"""The allocation under the cluster's rules: the fairness policy and the tenant quotas around
the DP (:mod:`.fairness`, :mod:`.quotas`, :mod:`.dp`).

Aging multiplies each job's row of G by its weight factor. The guaranteed minimum reserves, in
submission order, each job's smallest feasible unit count that still fits the units and its
tenant's quota, then shifts the job's row by it (row'[k] = row[k + reserved]), so the DP, run
on the units left, can only add to the reservation. Quotas become caps in units, less what was
reserved, and the DP honours them as a group knapsack. The alternatives are priced under the
same rules, in the job's real unit counts (-inf where the rules forbid one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from unicron.planning import dp, quotas
from unicron.planning.api import FloatArray, IntArray, JobView
from unicron.planning.explain import candidates
from unicron.planning.fairness import PlanRules
from unicron.planning.objective import JobTerms, keep_units, stack
from unicron.shared.contracts.plans import Fairness


@dataclass(frozen=True)
class Allocation:
    """Units per job, and what the rules did on the way there."""

    units: list[int]
    total: float  # the DP's objective: Σ over jobs of weight factor x G
    factors: list[float]  # each job's weight factor (aging; 1 otherwise)
    reserved: list[int]  # units each job was guaranteed before the DP
    caps: list[int | None]  # units each job's tenant may hold (None: no quota)
    ks: list[IntArray]  # alternatives weighed per job, in units
    totals: list[FloatArray]  # the best plan total giving each of them


def allocate_units(
    terms: Sequence[JobTerms], views: Sequence[JobView], rules: PlanRules, units: int, unit: int
) -> Allocation:
    """The optimal allocation of ``units`` units of ``unit`` slots under ``rules``."""
    factors = [rules.weight_factor(v.waited_s) for v in views]
    rewards = stack(terms, units + 1) * np.array(factors, dtype=np.float64)[:, None]
    keep = keep_units(terms)
    caps = [_units(rules.quotas.of(v.tenant), unit) for v in views]
    reserved = [0] * len(views)
    if rules.fairness == Fairness.GUARANTEED_MIN:
        reserved = guarantee(rewards, [v.tenant for v in views], caps, units)
    shifted, shifted_keep, left = _shift(rewards, keep, caps, reserved, views)
    rows = quotas.groups([(v.tenant, c) for v, c in zip(views, left, strict=True)])
    solution = quotas.optimise(shifted, shifted_keep, rows)
    chosen = [int(k) + r for k, r in zip(solution.units, reserved, strict=True)]
    ks = [candidates(t, u, k) for t, u, k in zip(terms, chosen, keep, strict=True)]
    moved = [k - r for k, r in zip(ks, reserved, strict=True)]  # negative: forbidden, -inf
    totals = quotas.alternatives(shifted, solution, moved)
    return Allocation(chosen, solution.total, factors, reserved, caps, ks, totals)


def _units(quota: int | None, unit: int) -> int | None:
    """A quota in slots as whole units (a unit the DP hands out is held in full)."""
    return None if quota is None else quota // unit


def smallest(row: FloatArray) -> int | None:
    """A job's smallest feasible positive unit count; None when it cannot run at all."""
    ks = np.flatnonzero(np.isfinite(row[1:]))
    return int(ks[0]) + 1 if ks.size else None


def guarantee(
    rewards: FloatArray, tenants: Sequence[str | None], caps: Sequence[int | None], units: int
) -> list[int]:
    """Each job's minimum, first come first served, where it fits the units and its quota."""
    left = units
    quota_left: dict[str, int] = {}
    reserved = []
    for row, tenant, cap in zip(rewards, tenants, caps, strict=True):
        lo = smallest(row)
        room = left if cap is None or tenant is None else min(left, quota_left.get(tenant, cap))
        if lo is None or lo > room:
            reserved.append(0)
            continue
        reserved.append(lo)
        left -= lo
        if cap is not None and tenant is not None:
            quota_left[tenant] = quota_left.get(tenant, cap) - lo
    return reserved


def _shift(
    rewards: FloatArray,
    keep: list[int],
    caps: list[int | None],
    reserved: list[int],
    views: Sequence[JobView],
) -> tuple[FloatArray, list[int], list[int | None]]:
    """The problem on the units left after the reservations, rows and caps shifted to match."""
    if not any(reserved):
        return rewards, keep, caps
    width = rewards.shape[1] - sum(reserved)
    rows = [row[r : r + width] for row, r in zip(rewards, reserved, strict=True)]
    shifted = np.vstack(rows) if rows else rewards[:, :width]
    kept = [k - r if k != dp.NO_KEEP and k >= r else dp.NO_KEEP
            for k, r in zip(keep, reserved, strict=True)]  # fmt: skip
    held: dict[str | None, int] = {}
    for v, r in zip(views, reserved, strict=True):
        held[v.tenant] = held.get(v.tenant, 0) + r
    left = [None if c is None else c - held[v.tenant] for v, c in zip(views, caps, strict=True)]
    return shifted, kept, left
