"""Per-tenant GPU quotas inside the allocation DP (docs/design.md §4): a group knapsack.

The jobs of a tenant with a quota of q units form one *group*. The DP of :mod:`.dp` run over
the group's jobs alone, on at most q units, gives H[u] = S_group[0][min(u, q)]: the group's best
reward on at most u units. The cluster DP then treats the group as one row with reward H,
beside one row per job of a tenant without a quota, under the cluster's units. Both levels are
exact, so the result is the optimum under every quota at once, not a plan trimmed afterwards.

Rows are ordered by their earliest job, and a group's jobs by submission, so the tie-break of
:mod:`.dp` still favours earlier jobs; a group row's tie-break bonus is the most of its jobs
kept at each u. Cost: a group of g jobs under q units adds O(g·q·K) inside and O(n²) outside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from unicron.planning import dp
from unicron.planning.api import FloatArray, IntArray


@dataclass(frozen=True)
class Group:
    """One row of the cluster DP: a single job (``cap`` None) or a capped tenant's jobs."""

    jobs: tuple[int, ...]  # rows of the reward matrix, in submission order
    cap: int | None = None  # units the jobs may hold together


def groups(caps: Sequence[tuple[str | None, int | None]]) -> list[Group]:
    """The DP's rows for jobs given as (tenant, its cap in units) in submission order."""
    members: dict[str, list[int]] = {}
    first: list[tuple[int, str | None]] = []
    for i, (tenant, cap) in enumerate(caps):
        if tenant is None or cap is None:
            first.append((i, None))
        elif tenant not in members:
            members[tenant] = [i]
            first.append((i, tenant))
        else:
            members[tenant].append(i)
    cap_of = dict(caps)
    return [
        Group((i,)) if tenant is None else Group(tuple(members[tenant]), cap_of[tenant])
        for i, tenant in first
    ]


@dataclass(frozen=True)
class _Inner:
    """A capped group's own DP: its rows cut to its cap, and the tables read from them."""

    group: Group
    rewards: FloatArray
    keep: list[int]
    bonus: dp.KeptArray
    best: FloatArray
    kept: dp.KeptArray

    @property
    def cap(self) -> int:
        return int(self.rewards.shape[1] - 1)


@dataclass(frozen=True)
class Solution:
    """The optimum under the quotas, and the cluster-level DP it was read from."""

    units: IntArray
    total: float
    groups: list[Group]
    outer: FloatArray  # one row per group
    outer_solution: dp.Solution
    inner: dict[int, _Inner]  # by group index, capped groups only


def optimise(rewards: FloatArray, keep: Sequence[int], rows: Sequence[Group]) -> Solution:
    """Units for each job maximising Σ G with Σ units ≤ n and each group within its cap."""
    m, width = rewards.shape
    outer, bonus, outer_keep = [], [], []
    inner: dict[int, _Inner] = {}
    for b, group in enumerate(rows):
        if group.cap is None:
            (i,) = group.jobs
            outer.append(rewards[i])
            bonus.append(dp.one_hot([keep[i]], width)[0])
            outer_keep.append(keep[i])
            continue
        sub = _inner(rewards, keep, group, width)
        at = np.minimum(np.arange(width), sub.cap)
        outer.append(sub.best[0, at])
        bonus.append(sub.kept[0, at])
        outer_keep.append(dp.NO_KEEP)
        inner[b] = sub
    matrix = np.vstack(outer) if outer else np.zeros((0, width), dtype=np.float64)
    kept = np.vstack(bonus) if bonus else np.zeros((0, width), dtype=dp.KEPT)
    solution = dp.optimise(matrix, outer_keep, kept)
    units = np.zeros(m, dtype=np.int64)
    for b, group in enumerate(rows):
        u = int(solution.units[b])
        if b in inner:
            units[list(group.jobs)] = _read(inner[b], min(u, inner[b].cap))
        else:
            units[group.jobs[0]] = u
    return Solution(units, solution.total, list(rows), matrix, solution, inner)


def _inner(rewards: FloatArray, keep: Sequence[int], group: Group, width: int) -> _Inner:
    assert group.cap is not None
    cap = min(group.cap, width - 1)
    sub = rewards[list(group.jobs), : cap + 1]
    sub_keep = [keep[i] if keep[i] <= cap else dp.NO_KEEP for i in group.jobs]
    bonus = dp.one_hot(sub_keep, cap + 1)
    best, kept = dp.tables(sub, bonus)
    return _Inner(group, sub, sub_keep, bonus, best, kept)


def _read(sub: _Inner, budget: int) -> IntArray:
    """The group's tie-broken optimum on at most ``budget`` units (tables are sliceable)."""
    w = budget + 1
    return dp.backtrack(sub.rewards[:, :w], sub.keep, sub.bonus[:, :w], sub.best[:, :w],
                        sub.kept[:, :w])  # fmt: skip


def alternatives(
    rewards: FloatArray, solution: Solution, candidates: Sequence[IntArray]
) -> list[FloatArray]:
    """As :func:`dp.alternatives`, under the quotas: for each job and each k in its
    candidates, the best total of any plan that gives it exactly k units. For a job in a
    capped group, with ``mates`` its group's other jobs on at most v units and ``others`` the
    other rows on at most a units:

        total(i, k) = G[i, k] + max over v ≤ cap - k of mates[v] + others[n - k - v]
    """
    rows = solution.groups
    outer_ks = [
        candidates[g.jobs[0]] if b not in solution.inner else np.zeros(0, dtype=np.int64)
        for b, g in enumerate(rows)
    ]
    outer = dp.alternatives(solution.outer, solution.outer_solution, outer_ks)
    totals: list[FloatArray] = [np.zeros(0)] * rewards.shape[0]
    for b, group in enumerate(rows):
        if b not in solution.inner:
            totals[group.jobs[0]] = outer[b]
    if not solution.inner:
        return totals
    prefix = dp.prefix_tables(solution.outer)
    suffix = solution.outer_solution.suffix
    n = rewards.shape[1] - 1
    for b, sub in solution.inner.items():
        others = dp.maxplus(prefix[b], suffix[b + 1])
        inner_prefix = dp.prefix_tables(sub.rewards)
        for pos, i in enumerate(sub.group.jobs):
            mates = dp.maxplus(inner_prefix[pos], sub.best[pos + 1])
            totals[i] = np.array(
                [_priced(rewards[i], int(k), sub.cap, n, mates, others) for k in candidates[i]],
                dtype=np.float64,
            )
    return totals


def _priced(
    g: FloatArray, k: int, cap: int, n: int, mates: FloatArray, others: FloatArray
) -> float:
    if not 0 <= k <= cap or not np.isfinite(g[k]):
        return -np.inf
    v = np.arange(cap - k + 1)
    return float(g[k] + (mates[v] + others[n - k - v]).max())
