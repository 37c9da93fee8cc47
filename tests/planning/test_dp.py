"""The DP against brute force, and the properties every allocation must have."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from unicron.planning import dp
from unicron.planning.api import JobDemand, Objective
from unicron.planning.clusters import A100
from unicron.planning.costs import ConstantDowntime, ModelledDowntime
from unicron.planning.objective import allocate, reward_matrix, value
from unicron.planning.spec import ModelShape
from unicron.planning.throughput import LinearThroughput, MegatronThroughput

# Weights and times that are exact in binary floating point, so ties are exact ties.
WEIGHTS = st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])


@st.composite
def instances(
    draw: st.DrawFn, max_jobs: int = 4, max_slots: int = 8
) -> tuple[list[JobDemand], int, Objective]:
    slots = draw(st.integers(0, max_slots))
    free = slots
    demands = []
    for i in range(draw(st.integers(0, max_jobs))):
        lo = draw(st.integers(1, max_slots))
        hi = draw(st.integers(lo, max_slots + 1))
        current = draw(st.integers(0, free))
        free -= current
        hit = draw(st.booleans())
        demands.append(JobDemand(f"j{i}", draw(WEIGHTS), lo, hi, current, hit))
    objective = Objective(
        throughput=LinearThroughput(),
        cost=ConstantDowntime(*(draw(st.integers(0, 40)) for _ in range(3))),
        run_s=draw(st.integers(1, 60)),
    )
    return demands, slots, objective


def g(d: JobDemand, x: int, objective: Objective) -> float | None:
    """docs/design.md §4 written out for one job and one count, independently of the code."""
    if x and not d.min_workers <= x <= d.max_workers:
        return None
    assert isinstance(objective.cost, ConstantDowntime)
    cost = objective.cost

    def rate(y: int) -> float:
        return float(y) if y >= d.min_workers else 0.0

    if d.hit:
        downtime = cost.restart_s
    elif x == d.current:
        downtime = 0.0
    else:
        downtime = cost.start_s if d.current == 0 else cost.resize_s
    return d.weight * rate(x) * objective.run_s - d.weight * rate(d.current) * downtime


def brute_force(demands: Sequence[JobDemand], slots: int, objective: Objective) -> list[int]:
    """Every allocation; the best, tie-broken as the DP promises."""
    best: tuple[object, ...] | None = None
    choice: list[int] = []
    for xs in itertools.product(range(slots + 1), repeat=len(demands)):
        rewards = [g(d, x, objective) for d, x in zip(demands, xs, strict=True)]
        if sum(xs) > slots or None in rewards:
            continue
        kept = [x == d.current and d.current > 0 for d, x in zip(demands, xs, strict=True)]
        order = [k for keep, x in zip(kept, xs, strict=True) for k in (keep, x)]
        key = (sum(r for r in rewards if r is not None), sum(kept), *order)
        if best is None or key > best:
            best, choice = key, list(xs)
    return choice


@settings(max_examples=300, deadline=None)
@given(instances())
def test_dp_equals_brute_force(instance: tuple[list[JobDemand], int, Objective]) -> None:
    demands, slots, objective = instance
    got = allocate(demands, slots, objective)
    want = brute_force(demands, slots, objective)
    assert value(demands, got, objective) == pytest.approx(value(demands, want, objective))
    assert got == want  # same optimum and the same tie-breaking


@settings(max_examples=100, deadline=None)
@given(instances(max_jobs=8, max_slots=40))
def test_constraints_always_hold(instance: tuple[list[JobDemand], int, Objective]) -> None:
    demands, slots, objective = instance
    got = allocate(demands, slots, objective)
    assert sum(got) <= slots
    for d, x in zip(demands, got, strict=True):
        assert x == 0 or d.min_workers <= x <= d.max_workers


@settings(max_examples=200, deadline=None)
@given(
    instances(max_jobs=3, max_slots=12),
    st.integers(0, 3),
    st.integers(0, 3),
    st.integers(1, 6),
    st.integers(0, 12),
    st.booleans(),
    WEIGHTS,
    st.booleans(),
)
def test_higher_weight_never_gets_fewer(
    instance: tuple[list[JobDemand], int, Objective],
    at_hi: int,
    at_lo: int,
    lo: int,
    span: int,
    running: bool,
    weight: float,
    hit: bool,
) -> None:
    """Twins that differ only in weight, anywhere in the queue, with D_run ≫ D_trans.

    (With D_run comparable to D_trans a running twin's keep-or-grow can be an exact tie,
    and "keep the current allocation on ties" then wins over weight.)
    """
    others, slots, _ = instance
    objective = Objective(LinearThroughput(), ConstantDowntime(30.0, 30.0, 0.0), run_s=3600.0)
    free = slots - sum(d.current for d in others)
    current = min(lo, free // 2) if running else 0
    demands = list(others)
    demands.insert(min(at_lo, len(demands)), JobDemand("lo", weight, lo, lo + span, current, hit))
    hi = JobDemand("hi", weight + 0.5, lo, lo + span, current, hit)
    demands.insert(min(at_hi, len(demands)), hi)
    got = dict(zip([d.job_id for d in demands], allocate(demands, slots, objective), strict=True))
    assert got["hi"] >= got["lo"]


def test_units_hand_out_whole_units() -> None:
    objective = Objective(LinearThroughput(), ConstantDowntime(), run_s=3600.0, unit=4)
    demands = [JobDemand("a", 1.0, 1, 6), JobDemand("b", 1.0, 2, 16)]
    assert allocate(demands, 14, objective) == [4, 8]  # 14 slots = 3 units of 4


def test_rejects_malformed_rewards() -> None:
    with pytest.raises(ValueError, match="zero units"):
        dp.solve(np.array([[-np.inf, 1.0]]), [dp.NO_KEEP])
    with pytest.raises(ValueError, match="one keep entry"):
        dp.solve(np.zeros((2, 3)), [dp.NO_KEEP])


def test_plans_32_jobs_on_1024_slots_quickly() -> None:
    rng = np.random.default_rng(0)
    demands = [
        JobDemand(f"j{i}", float(rng.choice([0.5, 1, 2])), int(lo), int(lo) * 8, int(lo) * 2)
        for i, lo in enumerate(rng.choice([1, 8, 16, 32], size=32))
    ]
    objective = Objective(LinearThroughput(), ConstantDowntime(), run_s=3600.0)
    assert reward_matrix(demands, 1024, objective).shape == (32, 1025)
    start = time.perf_counter()
    got = allocate(demands, 1024, objective)
    assert time.perf_counter() - start < 5.0  # ~0.1 s; generous for a loaded machine
    assert sum(got) <= 1024


# --- with the real models: Megatron throughput on A100 nodes, modelled transition costs -------

SHAPES = [
    ModelShape(24, 16, 2048, 2048, 51200),  # 1.3B
    ModelShape(32, 32, 4096, 2048, 51200),  # 6.7B: needs several GPUs
    ModelShape(40, 40, 5120, 2048, 51200),  # 13B
]
NODE_OBJECTIVE = Objective(MegatronThroughput(A100), ModelledDowntime(A100), run_s=600.0, unit=8)


@st.composite
def node_instances(
    draw: st.DrawFn, max_jobs: int = 4, max_nodes: int = 5
) -> tuple[list[JobDemand], int]:
    """Jobs whose bounds are not multiples of a node, some running, some hit by a fault."""
    gpus = 8 * draw(st.integers(0, max_nodes))
    free, demands = gpus, []
    for i in range(draw(st.integers(0, max_jobs))):
        lo = draw(st.integers(1, 40))
        hi = draw(st.integers(lo, 48))
        current = draw(st.integers(0, min(free, hi)))
        free -= current
        hit = current > 0 and draw(st.booleans())
        demands.append(
            JobDemand(
                f"j{i}", draw(WEIGHTS), lo, hi, current, hit, shape=draw(st.sampled_from(SHAPES)),
                global_batch=512, micro_batch=1, world_size=current,
                recovery="restart" if hit else None,
            )
        )  # fmt: skip
    return demands, gpus


def best_by_brute_force(rewards: np.ndarray, fixed: tuple[int, int] | None = None) -> float:
    """max Σ G over every allocation of at most n units (with job i at k if ``fixed``)."""
    m, width = rewards.shape
    choices = [np.flatnonzero(np.isfinite(rewards[i])).tolist() for i in range(m)]
    if fixed is not None:
        choices[fixed[0]] = [fixed[1]]
    best = -np.inf
    for ks in itertools.product(*choices):
        if sum(ks) < width:
            best = max(best, sum(rewards[i, k] for i, k in enumerate(ks)))
    return float(best)


@settings(max_examples=150, deadline=None)
@given(node_instances())
def test_dp_equals_brute_force_with_the_real_models(instance: tuple[list[JobDemand], int]) -> None:
    demands, gpus = instance
    rewards = reward_matrix(demands, gpus, NODE_OBJECTIVE)
    got = allocate(demands, gpus, NODE_OBJECTIVE)
    assert value(demands, got, NODE_OBJECTIVE) == pytest.approx(best_by_brute_force(rewards))
    assert sum(-(-x // 8) for x in got) <= gpus // 8  # whole nodes, never more than there are
    for d, x in zip(demands, got, strict=True):
        assert x == 0 or d.min_workers <= x <= d.max_workers


@settings(max_examples=100, deadline=None)
@given(node_instances(max_jobs=3, max_nodes=4))
def test_alternatives_are_the_best_plan_making_that_choice(
    instance: tuple[list[JobDemand], int],
) -> None:
    demands, gpus = instance
    rewards = reward_matrix(demands, gpus, NODE_OBJECTIVE)
    keep = [dp.NO_KEEP] * len(demands)
    solution = dp.optimise(rewards, keep)
    every = [np.arange(rewards.shape[1]) for _ in demands]
    for i, totals in enumerate(dp.alternatives(rewards, solution, every)):
        for k, total in enumerate(totals):
            want = best_by_brute_force(rewards, (i, k)) if np.isfinite(rewards[i, k]) else -np.inf
            assert total == pytest.approx(want)
            assert total <= solution.total + 1e-6 * abs(solution.total)


@settings(max_examples=100, deadline=None)
@given(node_instances(max_jobs=3), st.sampled_from(SHAPES), st.integers(1, 24), st.integers(0, 24))
def test_higher_weight_never_gets_fewer_with_the_real_models(
    instance: tuple[list[JobDemand], int], shape: ModelShape, lo: int, span: int
) -> None:
    others, gpus = instance
    twins = [
        JobDemand(name, w, lo, lo + span, shape=shape, global_batch=512, micro_batch=1)
        for name, w in (("lo", 1.0), ("hi", 2.0))
    ]
    for order in ([*others, *twins], [twins[1], *others, twins[0]]):
        got = dict(
            zip([d.job_id for d in order], allocate(order, gpus, NODE_OBJECTIVE), strict=True)
        )
        assert got["hi"] >= got["lo"]
