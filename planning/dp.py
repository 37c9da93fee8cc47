"""The allocation dynamic programme of docs/design.md §4: pure numpy, no I/O, no models.

Given G (``rewards[i, k]``: job i's reward for k units, -inf where infeasible, k = 0 always
feasible) and n units, it maximises Σ_i G[i, k_i] subject to Σ_i k_i ≤ n:

    S[i][j] = max_k S[i+1][j-k] + G[i, k]          S[m][j] = 0 (units may stay free)

The layers run from the last job to the first so that backtracking decides the first
(earliest-submitted) job first. Ties are broken deterministically, in this order:

1. the most jobs keep their current allocation (``keep[i]``; -1 for none) — no churn for
   nothing;
2. job by job in order, a job keeps its current allocation if it can, else takes the most
   units — earlier-submitted jobs win.

A row may also stand for a group of jobs (:mod:`.quotas`): then how many of its jobs keep their
allocation depends on the units it gets, so the tie-break takes a ``bonus`` matrix (jobs kept
for each row and unit count) instead of ``keep``. Rewards are floats, so "equal" means within a
relative 1e-9. A job's feasible counts are 0
and any subset of [lo, hi] (counts inside with no runnable configuration are -inf). Cost is
O(m·n·K) time and O(n·K) memory per layer, K = hi - lo + 1 ≤ n. :func:`alternatives` runs
the recurrence forwards once more to price "job i gets k units instead" exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided
from unicron.planning.api import FloatArray, IntArray

NO_KEEP = -1
REL_TOL = 1e-9
KEPT = np.int16  # jobs kept: small counts, and half the memory traffic of int64
KeptArray = npt.NDArray[np.int16]
T = TypeVar("T", bound=np.generic)


@dataclass(frozen=True)
class Solution:
    """An optimal allocation and the suffix tables S it was read from."""

    units: IntArray
    suffix: FloatArray
    total: float


def solve(rewards: FloatArray, keep: Sequence[int]) -> IntArray:
    """Units for each job (row of ``rewards``) of an optimal, tie-broken allocation."""
    return optimise(rewards, keep).units


def optimise(rewards: FloatArray, keep: Sequence[int], bonus: KeptArray | None = None) -> Solution:
    """The optimum; ``bonus`` (default: one where ``keep`` says) counts the jobs kept."""
    if rewards.ndim != 2 or rewards.shape[0] != len(keep):
        raise ValueError("rewards must be (jobs, units + 1) with one keep entry per job")
    if rewards.shape[0] and not np.isfinite(rewards[:, 0]).all():
        raise ValueError("zero units must be feasible for every job")
    if rewards.shape[0] > np.iinfo(KEPT).max:
        raise ValueError(f"at most {np.iinfo(KEPT).max} jobs")
    bonus = one_hot(keep, rewards.shape[1]) if bonus is None else bonus
    best, kept = tables(rewards, bonus)
    units = backtrack(rewards, keep, bonus, best, kept)
    return Solution(units, best, float(best[0, -1]) if rewards.shape[0] else 0.0)


def one_hot(keep: Sequence[int], width: int) -> KeptArray:
    """The tie-break bonus of single jobs: 1 at the unit count that keeps what a job holds."""
    bonus = np.zeros((len(keep), width), dtype=KEPT)
    for i, k in enumerate(keep):
        if 0 <= k < width:
            bonus[i, k] = 1
    return bonus


def maxplus(a: FloatArray, b: FloatArray) -> FloatArray:
    """out[t] = max over s ≤ t of a[s] + b[t - s]: two "best on at most t units" tables of
    disjoint sets of jobs combined into one (both of length t_max + 1)."""
    t = np.arange(a.size)
    rest = t[:, None] - t[None, :]
    summed = a[None, :] + b[np.maximum(rest, 0)]
    out: FloatArray = np.where(rest >= 0, summed, -np.inf).max(axis=1)
    return out


def alternatives(
    rewards: FloatArray, solution: Solution, candidates: Sequence[IntArray]
) -> list[FloatArray]:
    """For each job i and each k in ``candidates[i]``: the best total reward of any plan that
    gives job i exactly k units (-inf where none can). One forward pass gives P, the best of
    the jobs before i on at most a units; the suffix S covers the jobs after it:

        total(i, k) = G[i, k] + max_a P[i][a] + S[i+1][n - k - a]
    """
    prefix = prefix_tables(rewards)
    m, n = rewards.shape[0], rewards.shape[1] - 1
    width = max((ks.size for ks in candidates), default=0)
    padded = np.full((m, width), -1, dtype=np.int64)  # -1: no candidate in this column
    for i, ks in enumerate(candidates):
        padded[i, : ks.size] = ks
    fits = (padded >= 0) & (padded <= n)
    k = np.clip(padded, 0, n)
    g = np.where(fits, np.take_along_axis(rewards, k, axis=1), -np.inf)
    # For each job and candidate: max over a ≤ n - k of P[i][a] + S[i+1][n - k - a].
    after = (n - k)[:, :, None] - np.arange(n + 1)[None, None, :]
    rows = np.arange(m)[:, None, None]
    split = prefix[:m][:, None, :] + solution.suffix[1:][rows, np.maximum(after, 0)]
    best = np.where(after >= 0, split, -np.inf).max(axis=2, initial=-np.inf)
    totals = np.where(np.isfinite(g), g + best, -np.inf)
    return [totals[i, : ks.size] for i, ks in enumerate(candidates)]


def _tol(value: FloatArray) -> FloatArray:
    return REL_TOL * np.maximum(1.0, np.abs(value))


def _candidates(
    best_next: FloatArray, kept_next: KeptArray, g: FloatArray, bonus: KeptArray, j: IntArray
) -> tuple[FloatArray, IntArray, IntArray]:
    """For each budget in ``j`` (rows) and feasible k (columns): total reward and keeps."""
    ks = np.flatnonzero(np.isfinite(g)).astype(np.int64)
    rest = j[:, None] - ks[None, :]
    fits = rest >= 0
    rest = np.maximum(rest, 0)  # a valid index everywhere; masked below where k > j
    values = np.where(fits, best_next[rest] + g[ks], -np.inf)
    keeps = np.where(fits, kept_next[rest] + bonus[ks], -1)
    return values, keeps.astype(np.int64), ks


def _bounds(rewards: FloatArray) -> tuple[list[int], list[int]]:
    """Each job's smallest and largest feasible positive unit count (1, 0 when none)."""
    finite = np.isfinite(rewards[:, 1:])
    if finite.shape[1] == 0:  # no units at all
        return [1] * len(finite), [0] * len(finite)
    some = finite.any(axis=1)
    lo = np.where(some, finite.argmax(axis=1) + 1, 1)
    hi = np.where(some, finite.shape[1] - finite[:, ::-1].argmax(axis=1), 0)
    return lo.tolist(), hi.tolist()


def tables(rewards: FloatArray, bonus: KeptArray) -> tuple[FloatArray, KeptArray]:
    """S (best reward) and, among near-best choices, the most jobs kept; row i = jobs i..
    Column j covers budgets of at most j units, so a table for fewer units is a slice."""
    m, width = rewards.shape
    best = np.zeros((m + 1, width), dtype=np.float64)
    kept = np.zeros((m + 1, width), dtype=KEPT)
    lo, hi = _bounds(rewards)
    for i in range(m - 1, -1, -1):
        values, keeps = _layer(best[i + 1], rewards[i], lo[i], hi[i], kept[i + 1], bonus[i])
        assert keeps is not None
        best[i] = values.max(axis=1)
        near = _near(values, best[i][:, None])
        kept[i] = np.where(near, keeps, -1).max(axis=1)
    return best, kept


def prefix_tables(rewards: FloatArray) -> FloatArray:
    """P[i][j]: the best reward of jobs 0..i-1 on at most j units (the DP run forwards)."""
    m, width = rewards.shape
    best = np.zeros((m + 1, width), dtype=np.float64)
    lo, hi = _bounds(rewards)
    for i in range(m):
        values, _ = _layer(best[i], rewards[i], lo[i], hi[i])
        best[i + 1] = values.max(axis=1)
    return best


def _windows(series: npt.NDArray[T], hi: int, span: int, fill: float) -> npt.NDArray[T]:
    """Row j = series[j - hi .. j - hi + span - 1], ``fill`` where the index is negative."""
    padded = np.empty(series.size + hi, dtype=series.dtype)
    padded[:hi] = fill
    padded[hi:] = series
    step = padded.strides[0]
    return as_strided(padded, shape=(series.size, span), strides=(step, step), writeable=False)


def _layer(
    best_next: FloatArray,
    g: FloatArray,
    lo: int,
    hi: int,
    kept_next: KeptArray | None = None,
    bonus: KeptArray | None = None,
) -> tuple[FloatArray, KeptArray | None]:
    """Like :func:`_candidates` for every budget, from strided views: no gathers.

    Column 0 is k = 0; the rest are k = hi, hi-1, .., lo for the job's feasible range
    [lo, hi]; infeasible counts inside it are -inf and so never near the best. Without
    ``kept_next`` only the values are computed (alternatives need no tie-break).
    """
    width = best_next.size
    span = max(hi - lo + 1, 0)
    ks_desc = np.arange(hi, lo - 1, -1)
    values = np.empty((width, span + 1), dtype=np.float64)
    values[:, 0] = best_next + g[0]
    # windows[j, p] = S[j - k] for k = hi - p; -inf (and -1 kept) where k > j.
    np.add(_windows(best_next, hi, span, -np.inf), g[ks_desc], out=values[:, 1:])
    if kept_next is None or bonus is None:
        return values, None
    keeps = np.empty((width, span + 1), dtype=KEPT)
    keeps[:, 0] = kept_next + bonus[0]
    window_kept = _windows(kept_next, hi, span, -1)
    np.add(window_kept, bonus[ks_desc], out=keeps[:, 1:])
    return values, keeps


def _near(values: FloatArray, target: FloatArray) -> npt.NDArray[np.bool_]:
    return values >= target - _tol(target)


def backtrack(
    rewards: FloatArray, keep: Sequence[int], bonus: KeptArray, best: FloatArray, kept: KeptArray
) -> IntArray:
    """The tie-broken optimum read from :func:`tables` on a budget of ``width - 1`` units."""
    m, width = rewards.shape
    units = np.zeros(m, dtype=np.int64)
    budget = width - 1
    for i in range(m):
        at = np.array([budget], dtype=np.int64)
        values, keeps, ks = _candidates(best[i + 1], kept[i + 1], rewards[i], bonus[i], at)
        target = best[i, budget : budget + 1]
        optimal = _near(values[0], target) & (keeps[0] == kept[i, budget])
        choices = ks[optimal]
        k = keep[i] if keep[i] in choices else int(choices.max())
        units[i] = k
        budget -= k
    return units
