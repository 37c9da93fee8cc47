"""The allocation dynamic programme of DESIGN.md §4: pure numpy, no I/O, no models.

Given G (``rewards[i, k]``: job i's reward for k units, -inf where infeasible, k = 0 always
feasible) and n units, it maximises Σ_i G[i, k_i] subject to Σ_i k_i ≤ n:

    S[i][j] = max_k S[i+1][j-k] + G[i, k]          S[m][j] = 0 (units may stay free)

The layers run from the last job to the first so that backtracking decides the first
(earliest-submitted) job first. Ties are broken deterministically, in this order:

1. the most jobs keep their current allocation (``keep[i]``; -1 for none) — no churn for
   nothing;
2. job by job in order, a job keeps its current allocation if it can, else takes the most
   units — earlier-submitted jobs win.

Rewards are floats, so "equal" means within a relative 1e-9. Cost is O(m·n·K) time and
O(n·K) memory per layer, K ≤ n+1 the feasible unit counts of a job.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from services.planner.api import FloatArray, IntArray

NO_KEEP = -1
REL_TOL = 1e-9


def solve(rewards: FloatArray, keep: Sequence[int]) -> IntArray:
    """Units for each job (row of ``rewards``) of an optimal, tie-broken allocation."""
    if rewards.ndim != 2 or rewards.shape[0] != len(keep):
        raise ValueError("rewards must be (jobs, units + 1) with one keep entry per job")
    if rewards.shape[0] and not np.isfinite(rewards[:, 0]).all():
        raise ValueError("zero units must be feasible for every job")
    best, kept = _tables(rewards, keep)
    return _backtrack(rewards, keep, best, kept)


def _tol(value: FloatArray) -> FloatArray:
    return REL_TOL * np.maximum(1.0, np.abs(value))


def _candidates(
    best_next: FloatArray, kept_next: IntArray, g: FloatArray, keep: int, j: IntArray
) -> tuple[FloatArray, IntArray, IntArray]:
    """For each budget in ``j`` (rows) and feasible k (columns): total reward and keeps."""
    ks = np.flatnonzero(np.isfinite(g)).astype(np.int64)
    rest = j[:, None] - ks[None, :]
    fits = rest >= 0
    rest = np.maximum(rest, 0)  # a valid index everywhere; masked below where k > j
    values = np.where(fits, best_next[rest] + g[ks], -np.inf)
    keeps = np.where(fits, kept_next[rest] + (ks == keep), -1)
    return values, keeps.astype(np.int64), ks


def _tables(rewards: FloatArray, keep: Sequence[int]) -> tuple[FloatArray, IntArray]:
    """S (best reward) and, among near-best choices, the most jobs kept; row i = jobs i.."""
    m, width = rewards.shape
    best = np.zeros((m + 1, width), dtype=np.float64)
    kept = np.zeros((m + 1, width), dtype=np.int64)
    for i in range(m - 1, -1, -1):
        values, keeps = _layer(best[i + 1], kept[i + 1], rewards[i], keep[i])
        best[i] = values.max(axis=1)
        near = _near(values, best[i][:, None])
        kept[i] = np.where(near, keeps, -1).max(axis=1)
    return best, kept


def _layer(
    best_next: FloatArray, kept_next: IntArray, g: FloatArray, keep: int
) -> tuple[FloatArray, IntArray]:
    """Like :func:`_candidates` for every budget, as a view: no gathers, two matrices.

    Column 0 is k = 0; the rest are k = hi, hi-1, .., lo for the job's feasible range
    [lo, hi] (feasible counts are 0 and one contiguous range, see ``JobDemand.feasible``).
    """
    width = best_next.size
    ks = np.flatnonzero(np.isfinite(g[1:])) + 1
    if ks.size and ks[-1] - ks[0] + 1 != ks.size:
        raise ValueError("the feasible unit counts of a job must be 0 and one range")
    lo, hi = (int(ks[0]), int(ks[-1])) if ks.size else (1, 0)
    span = hi - lo + 1
    # padded[j + p] = S[j - k] for k = hi - p; -inf (and -1 kept) where k > j.
    padded = np.concatenate([np.full(hi, -np.inf), best_next])
    padded_kept = np.concatenate([np.full(hi, -1, dtype=np.int64), kept_next])
    window = sliding_window_view(padded, span)[:width]
    window_kept = sliding_window_view(padded_kept, span)[:width]
    ks_desc = np.arange(hi, lo - 1, -1)
    values = np.empty((width, span + 1), dtype=np.float64)
    values[:, 0] = best_next + g[0]
    np.add(window, g[ks_desc], out=values[:, 1:])
    keeps = np.empty((width, span + 1), dtype=np.int64)
    keeps[:, 0] = kept_next + (keep == 0)
    np.add(window_kept, ks_desc == keep, out=keeps[:, 1:])
    return values, keeps


def _near(values: FloatArray, target: FloatArray) -> npt.NDArray[np.bool_]:
    return values >= target - _tol(target)


def _backtrack(
    rewards: FloatArray, keep: Sequence[int], best: FloatArray, kept: IntArray
) -> IntArray:
    m, width = rewards.shape
    units = np.zeros(m, dtype=np.int64)
    budget = width - 1
    for i in range(m):
        at = np.array([budget], dtype=np.int64)
        values, keeps, ks = _candidates(best[i + 1], kept[i + 1], rewards[i], keep[i], at)
        target = best[i, budget : budget + 1]
        optimal = _near(values[0], target) & (keeps[0] == kept[i, budget])
        choices = ks[optimal]
        k = keep[i] if keep[i] in choices else int(choices.max())
        units[i] = k
        budget -= k
    return units
