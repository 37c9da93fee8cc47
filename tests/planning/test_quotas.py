"""Per-tenant quotas: the DP's plan is the optimum under every quota (brute force), its
alternatives are exact under them, and the guaranteed minimum keeps to them too."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from unicron.planning.allocation import allocate_units, guarantee
from unicron.planning.api import JobDemand, JobView, Objective
from unicron.planning.costs import ConstantDowntime
from unicron.planning.fairness import PlanRules, TenantQuotas
from unicron.planning.objective import all_terms, stack
from unicron.planning.throughput import LinearThroughput
from unicron.shared.contracts.models import JobState
from unicron.shared.contracts.plans import Fairness

from tests.planning.test_dp import NODE_OBJECTIVE, g, instances, node_instances

TENANTS = st.sampled_from(["team-a", "team-b", None])
Quotas = dict[str, int]
LINEAR_NODES = Objective(LinearThroughput(), ConstantDowntime(), 3600.0, unit=8)


def views(demands: Sequence[JobDemand], tenants: Sequence[str | None]) -> list[JobView]:
    return [
        JobView(d, JobState.RUNNING if d.current else JobState.PENDING, d.current, 0, tenant=t)
        for d, t in zip(demands, tenants, strict=True)
    ]


def within(xs: Sequence[int], tenants: Sequence[str | None], quotas: Quotas, unit: int) -> bool:
    """Each tenant's jobs hold at most its quota, counting whole units as the DP hands out."""
    held: dict[str, int] = {}
    for x, t in zip(xs, tenants, strict=True):
        if t is not None:
            held[t] = held.get(t, 0) + -(-x // unit) * unit
    return all(held.get(t, 0) <= q for t, q in quotas.items())


def brute_best(
    demands: Sequence[JobDemand],
    tenants: Sequence[str | None],
    quotas: Quotas,
    slots: int,
    objective: Objective,
) -> float:
    """The best Σ G over every allocation within the slots and the quotas, from §4 written out."""
    best = -np.inf
    for xs in itertools.product(range(slots + 1), repeat=len(demands)):
        rewards = [g(d, x, objective) for d, x in zip(demands, xs, strict=True)]
        if sum(xs) > slots or None in rewards or not within(xs, tenants, quotas, 1):
            continue
        best = max(best, sum(r for r in rewards if r is not None))
    return float(best)


@settings(max_examples=250, deadline=None)
@given(instances(max_jobs=4, max_slots=7), st.data())
def test_the_plan_is_the_optimum_under_the_quotas(
    instance: tuple[list[JobDemand], int, Objective], data: st.DataObject
) -> None:
    demands, slots, objective = instance
    tenants = [data.draw(TENANTS) for _ in demands]
    quotas = {t: data.draw(st.integers(0, slots)) for t in ("team-a", "team-b")}
    rules = PlanRules(quotas=TenantQuotas.parse(quotas))
    terms = all_terms(demands, slots, objective)
    got = allocate_units(terms, views(demands, tenants), rules, slots, 1)
    xs = [t.workers(u) for t, u in zip(terms, got.units, strict=True)]
    assert sum(xs) <= slots and within(xs, tenants, quotas, 1)
    for d, x in zip(demands, xs, strict=True):
        assert x == 0 or d.min_workers <= x <= d.max_workers
    want = brute_best(demands, tenants, quotas, slots, objective)
    got_value = sum(g(d, x, objective) or 0.0 for d, x in zip(demands, xs, strict=True))
    assert got_value == pytest.approx(want)
    assert got.total == pytest.approx(want)


def best_under_quotas(
    rewards: np.ndarray,
    tenants: Sequence[str | None],
    caps: dict[str, int],
    fixed: tuple[int, int] | None = None,
) -> float:
    """max Σ G in units, within the cluster and the caps (job i at k if ``fixed``)."""
    m, width = rewards.shape
    choices = [np.flatnonzero(np.isfinite(rewards[i])).tolist() for i in range(m)]
    if fixed is not None:
        choices[fixed[0]] = [fixed[1]] if np.isfinite(rewards[fixed]) else []
    best = -np.inf
    for ks in itertools.product(*choices):
        if sum(ks) < width and within(ks, tenants, caps, 1):
            best = max(best, sum(rewards[i, k] for i, k in enumerate(ks)))
    return float(best)


@settings(max_examples=100, deadline=None)
@given(node_instances(max_jobs=3, max_nodes=4), st.data())
def test_alternatives_are_exact_under_the_quotas_with_the_real_models(
    instance: tuple[list[JobDemand], int], data: st.DataObject
) -> None:
    demands, gpus = instance
    tenants = [data.draw(TENANTS) for _ in demands]
    caps = {t: data.draw(st.integers(0, gpus // 8)) for t in ("team-a", "team-b")}
    rules = PlanRules(quotas=TenantQuotas.parse({t: 8 * c for t, c in caps.items()}))
    terms = all_terms(demands, gpus, NODE_OBJECTIVE)
    rewards = stack(terms, gpus // 8 + 1)
    got = allocate_units(terms, views(demands, tenants), rules, gpus // 8, 8)
    assert got.total == pytest.approx(best_under_quotas(rewards, tenants, caps))
    assert within(got.units, tenants, caps, 1)
    for i, (ks, totals) in enumerate(zip(got.ks, got.totals, strict=True)):
        for k, total in zip(ks, totals, strict=True):
            want = best_under_quotas(rewards, tenants, caps, (i, int(k)))
            assert total == pytest.approx(want)


def test_a_tenant_over_its_quota_leaves_the_rest_to_the_other_tenant() -> None:
    demands = [JobDemand("a-1", 2.0, 8, 32), JobDemand("a-2", 2.0, 8, 16),
               JobDemand("b-1", 0.5, 8, 32)]  # fmt: skip
    tenants = ["team-a", "team-a", "team-b"]
    terms = all_terms(demands, 64, LINEAR_NODES)
    free = allocate_units(terms, views(demands, tenants), PlanRules(), 8, 8)
    assert [t.workers(u) for t, u in zip(terms, free.units, strict=True)] == [32, 16, 16]
    capped = PlanRules(quotas=TenantQuotas.parse({"team-a": 24}))
    got = allocate_units(terms, views(demands, tenants), capped, 8, 8)
    # team-a's 24 slots (a tie between its twins: the earlier takes them); team-b the rest
    assert [t.workers(u) for t, u in zip(terms, got.units, strict=True)] == [24, 0, 32]


def test_the_guaranteed_minimum_goes_first_come_first_served_within_quotas() -> None:
    rewards = np.array(
        [
            [0.0, -np.inf, 5.0, 6.0, 7.0],  # min 2 units
            [0.0, 1.0, 2.0, 3.0, 4.0],  # min 1
            [0.0, -np.inf, -np.inf, 1.0, 2.0],  # min 3: does not fit after the first two
            [0.0, 1.0, 1.5, -np.inf, -np.inf],  # min 1, but its tenant's cap is 0
            [0.0, 0.5, 0.6, 0.7, 0.8],  # min 1: fits in the last unit
        ]
    )
    tenants = [None, "team-a", None, "team-b", "team-a"]
    caps = [None, 2, None, 0, 2]
    assert guarantee(rewards, tenants, caps, 4) == [2, 1, 0, 0, 1]


def test_guaranteed_min_gives_every_job_its_minimum_before_waf() -> None:
    demands = [JobDemand("heavy", 4.0, 2, 8), JobDemand("light", 0.5, 2, 4),
               JobDemand("lighter", 0.25, 2, 4)]  # fmt: skip
    objective = Objective(LinearThroughput(), ConstantDowntime(), 3600.0)
    terms = all_terms(demands, 8, objective)
    waf = allocate_units(terms, views(demands, [None] * 3), PlanRules(), 8, 1)
    assert waf.units == [8, 0, 0]
    rules = PlanRules(Fairness.GUARANTEED_MIN)
    got = allocate_units(terms, views(demands, [None] * 3), rules, 8, 1)
    assert got.units == [4, 2, 2] and got.reserved == [2, 2, 2]
    # the rest is still WAF's: "heavy" takes every unit beyond the minimums
    assert got.totals[0][list(got.ks[0]).index(2)] < got.total
