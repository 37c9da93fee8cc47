"""Plan-time benchmark: m jobs by n GPUs on 8-GPU A100 nodes, 20 re-plans each, p50 and p99.

``python bench/plan.py`` (or ``make bench-plan``). Each case builds a busy cluster — GPT-3
family jobs (1.3B to 175B) whose maximum sizes together ask for about twice the GPUs there are
— plans it once from scratch, runs that plan, and then times 20 re-plans, each after one
random event of the kinds that trigger planning: a job is hit by a fault, a node is lost, a
job finishes, or a new job is submitted. The time is ``plan_cluster``: calibration applied,
the reward matrix, the DP with its alternatives, placement and explanations — everything but
the Redis reads. The untimed first plan of a case pays for the best-configuration search of
each model shape; the timed re-plans reuse it and every unchanged job's terms, as the service
does (a new job, or a job hit by a fault, is computed afresh).

``--quotas`` times the same cases with the jobs spread over four tenants, each capped at a
quarter of the cluster (``UNICRON_TENANT_QUOTAS='{"*": …}'``), so the DP runs as a group
knapsack (planning/quotas.py).

Prints a table, then as its last line one JSON object:
``{"p50_ms": {"128x4096": …}, "p99_ms": {…}, "quotas": false}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from unicron.planning.api import Calibration, ClusterInputs, JobDemand, JobView, NodeView
from unicron.planning.calibration import LLAMA3_FAILURES_PER_GPU_H as RATE
from unicron.planning.fairness import PlanRules, TenantQuotas
from unicron.planning.planning import plan_cluster
from unicron.planning.spec import ModelShape
from unicron.services.planner.settings import PlannerSettings
from unicron.shared.contracts.models import JobState
from unicron.shared.contracts.taxonomy import RecoveryAction

JOBS = (8, 32, 128)
GPUS = (128, 1024, 4096)
RUNS = 20
NODE = 8
TENANTS = 4
# GPT-3 family (Brown et al. 2020, Table 2.1), heads rounded to divide the width; sequences
# per step as GPT-3 trained them.
MODELS = (
    (ModelShape(24, 16, 2048, 2048, 51200), 512),  # 1.3B
    (ModelShape(32, 32, 2560, 2048, 51200), 512),  # 2.7B
    (ModelShape(32, 32, 4096, 2048, 51200), 1024),  # 6.7B
    (ModelShape(40, 40, 5120, 2048, 51200), 1024),  # 13B
    (ModelShape(96, 96, 12288, 2048, 51200), 1536),  # 175B
)
SMALLEST = (8, 8, 8, 16, 64)  # GPUs each needs at least (memory), a multiple of a node


def job(rng: np.random.Generator, i: int, gpus: int, jobs: int) -> JobDemand:
    kind = int(rng.integers(len(MODELS)))
    shape, batch = MODELS[kind]
    share = 2 * gpus / jobs  # together the jobs ask for about twice the cluster
    nodes = max(share * rng.uniform(0.5, 2), NODE) / NODE
    top = max(SMALLEST[kind], NODE * int(2 ** np.round(np.log2(nodes))))
    low = max(SMALLEST[kind], top // 4)
    weight = float(rng.choice([0.5, 1.0, 1.0, 2.0]))
    return JobDemand(
        f"job-{i:03d}", weight, low, top, shape=shape, global_batch=batch, micro_batch=1
    )


def cluster(gpus: int, jobs: int, seed: int) -> ClusterInputs:
    rng = np.random.default_rng(seed)
    nodes = tuple(NodeView(f"node-{n:04d}", NODE) for n in range(gpus // NODE))
    views = tuple(JobView(job(rng, i, gpus, jobs), JobState.PENDING, 0, 0) for i in range(jobs))
    # D_run from the Llama 3 failure rate: about 11 h on 4,096 GPUs, 2 weeks on 128.
    return ClusterInputs(nodes, views, calibration=Calibration(failure_rate_per_gpu_h=RATE))


def running(inputs: ClusterInputs, settings: PlannerSettings) -> ClusterInputs:
    """The cluster after its first plan ran: every placed job RUNNING where it was put."""
    draft = plan_cluster(inputs, settings.objective())
    views = []
    for view, a in zip(inputs.jobs, draft.allocations, strict=True):
        if a.workers == 0:
            views.append(view)
            continue
        demand = replace(view.demand, current=a.workers, world_size=a.workers)
        views.append(JobView(demand, JobState.RUNNING, a.workers, 1, tuple(a.nodes)))
    return replace(inputs, jobs=tuple(views))


def perturb(inputs: ClusterInputs, rng: np.random.Generator, i: int) -> ClusterInputs:
    """One trigger's worth of change: a fault, a lost node, a finished or a new job."""
    jobs = list(inputs.jobs)
    live = [k for k, v in enumerate(jobs) if v.state == JobState.RUNNING]
    event = i % 4
    if event == 0 and live:  # a fault hits a running job: it must restart (or shrink)
        k = int(rng.choice(live))
        demand = replace(jobs[k].demand, hit=True, recovery=RecoveryAction.RESTART)
        jobs[k] = replace(jobs[k], demand=demand)
    elif event == 1:  # a node is lost: its ranks are gone, their jobs are hit
        lost = inputs.nodes[int(rng.integers(len(inputs.nodes)))].node_id
        nodes = tuple(n for n in inputs.nodes if n.node_id != lost)
        jobs = [_without(v, lost) for v in jobs]
        return replace(inputs, nodes=nodes, jobs=tuple(jobs))
    elif event == 2 and live:  # a job finishes
        jobs.pop(int(rng.choice(live)))
    else:  # a job is submitted
        jobs.append(JobView(job(rng, 1000 + i, inputs.capacity, len(jobs)), JobState.PENDING, 0, 0))
    return replace(inputs, jobs=tuple(jobs))


def _without(view: JobView, node: str) -> JobView:
    if node not in view.ranks:
        return view
    ranks = tuple(n for n in view.ranks if n != node)
    demand = replace(view.demand, current=len(ranks), hit=True, recovery=RecoveryAction.RECONFIGURE)
    return replace(view, demand=demand, ranks=ranks)


def tenants(inputs: ClusterInputs) -> ClusterInputs:
    """The jobs dealt round-robin to the tenants (a new job has none: it stays unlimited)."""
    views = tuple(replace(v, tenant=f"team-{i % TENANTS}") for i, v in enumerate(inputs.jobs))
    return replace(inputs, jobs=views)


def quarter(gpus: int) -> PlanRules:
    share = gpus // TENANTS // NODE * NODE
    return PlanRules(quotas=TenantQuotas.parse({"*": share}))


def measure(jobs: int, gpus: int, settings: PlannerSettings, quotas: bool = False) -> list[float]:
    base = running(cluster(gpus, jobs, seed=jobs * 7919 + gpus), settings)
    rules = quarter(gpus) if quotas else PlanRules()
    if quotas:
        base = tenants(base)
    objective = settings.objective()
    rng = np.random.default_rng(gpus + jobs)
    times = []
    for i in range(RUNS):
        inputs = perturb(base, rng, i)
        started = time.perf_counter()
        plan_cluster(inputs, objective, rules)
        times.append((time.perf_counter() - started) * 1e3)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quotas", action="store_true", help="four tenants, a quarter each")
    quotas = parser.parse_args(argv).quotas
    settings = PlannerSettings(planner_cluster="a100")
    title = f"plan time, {RUNS} re-plans per case (a100 preset, {NODE}-GPU nodes)"
    if quotas:
        title += f", {TENANTS} tenants capped at a quarter each"
    table = Table(title=title)
    for header in ("jobs", "GPUs", "units", "p50 ms", "p99 ms", "max ms"):
        table.add_column(header, justify="right")
    p50: dict[str, float] = {}
    p99: dict[str, float] = {}
    for gpus in GPUS:
        for jobs in JOBS:
            times = measure(jobs, gpus, settings, quotas)
            key = f"{jobs}x{gpus}"
            p50[key] = round(float(np.percentile(times, 50)), 2)
            p99[key] = round(float(np.percentile(times, 99)), 2)
            table.add_row(str(jobs), str(gpus), str(gpus // NODE), f"{p50[key]:.1f}",
                          f"{p99[key]:.1f}", f"{max(times):.1f}")  # fmt: skip
    Console().print(table)
    print(json.dumps({"p50_ms": p50, "p99_ms": p99, "quotas": quotas}))


if __name__ == "__main__":
    main()
