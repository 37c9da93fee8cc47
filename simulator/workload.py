"""Jobs as the planner sees them: a GPT shape for a parameter count, the planner's
:class:`~unicron.planning.api.JobDemand`, and the job's failure-free throughput T(x) from the
planner's own performance model (:class:`~unicron.planning.throughput.MegatronThroughput`).

A job of ``params_b`` billion parameters trains the GPT-3 family member (Brown et al. 2020,
Table 2.1; heads rounded to divide the width, as ``bench/plan.py`` does) nearest in log scale,
with the global batch GPT-3 trained it with. Below 0.1 B it is the reference trainer's model
(:data:`unicron.planning.spec.DEFAULT_SHAPE`), which is what the CPU cluster runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from unicron.planning.api import DEFAULT_SPEC, Curve, JobDemand, ThroughputModel
from unicron.planning.spec import DEFAULT_SHAPE, ModelShape
from unicron.simulator.inputs import JobConfig

GPT3: tuple[tuple[float, ModelShape, int], ...] = (
    (0.35, ModelShape(24, 16, 1024, 2048, 51200), 256),
    (0.76, ModelShape(24, 16, 1536, 2048, 51200), 256),
    (1.3, ModelShape(24, 16, 2048, 2048, 51200), 512),
    (2.7, ModelShape(32, 32, 2560, 2048, 51200), 512),
    (6.7, ModelShape(32, 32, 4096, 2048, 51200), 1024),
    (13.0, ModelShape(40, 40, 5120, 2048, 51200), 1024),
    (30.0, ModelShape(48, 56, 7168, 2048, 51200), 1536),
    (70.0, ModelShape(80, 64, 8192, 2048, 51200), 1536),
    (175.0, ModelShape(96, 96, 12288, 2048, 51200), 1536),
)


def shape_for(params_b: float) -> tuple[ModelShape, int, int]:
    """(shape, global batch, submitted micro-batch) of a job of ``params_b`` billion."""
    if params_b < 0.1:  # what a spec that names no model and no batch trains
        return DEFAULT_SHAPE, DEFAULT_SPEC.global_batch, DEFAULT_SPEC.micro_batch
    _, shape, batch = min(GPT3, key=lambda row: abs(math.log(row[0] / params_b)))
    return shape, batch, 1


def demand_of(job: JobConfig, iteration_s: float = math.nan) -> JobDemand:
    """The job's demand while waiting; callers ``replace`` what running changes. It is the
    demand of the default spec with the job's size, weight and bounds: checkpoints every
    ``checkpoint_interval_s`` once its step time is known, as often as the spec's before."""
    shape, batch, micro = shape_for(job.params_b)
    demand = JobDemand.of(job.name)
    every = demand.checkpoint_every
    if math.isfinite(iteration_s) and iteration_s > 0:
        every = max(1, round(job.checkpoint_interval_s / iteration_s))
    return replace(
        demand,
        weight=job.weight,
        min_workers=job.min_gpus,
        max_workers=job.max_gpus,
        shape=shape,
        global_batch=batch,
        micro_batch=micro,
        checkpoint_every=every,
    )


@dataclass
class Speeds:
    """T(x) of one job on one throughput model, for every worker count up to the cluster's,
    computed once from the model's curve (one vectorised search, cached by the planner)."""

    model: ThroughputModel
    job: JobConfig
    capacity: int
    unit: int  # GPUs per node: jobs run on whole nodes
    curve: Curve = field(init=False)

    def __post_init__(self) -> None:
        workers = np.arange(self.capacity // self.unit + 1, dtype=np.int64) * self.unit
        self.curve = self.model.curve(demand_of(self.job), workers)

    def _index(self, workers: int) -> int:
        k, rest = divmod(workers, self.unit)
        return k if rest == 0 and 0 <= workers <= self.capacity else -1

    def flops(self, workers: int) -> float:
        k = self._index(workers)
        return float(self.curve.flops[k]) if k > 0 else 0.0

    def iteration_s(self, workers: int) -> float:
        k = self._index(workers)
        return float(self.curve.iteration_s[k]) if k > 0 else math.inf

    def config(self, workers: int) -> tuple[int, int, int, int]:
        """(TP, PP, DP, micro-batch) behind T(workers); zeros where it cannot run."""
        k, c = self._index(workers), self.curve
        return (
            (int(c.tp[k]), int(c.pp[k]), int(c.dp[k]), int(c.micro_batch[k]))
            if k > 0
            else (0, 0, 0, 0)
        )

    def best_fit(self, available: int) -> int:
        """The most workers ≤ ``available`` (and ≤ max) the job can run on; 0 if none."""
        top = min(available, self.job.max_gpus, self.capacity) // self.unit
        runs = np.flatnonzero(self.curve.flops[: top + 1] > 0)
        best = int(runs[-1]) * self.unit if runs.size else 0
        return best if best >= self.job.min_gpus else 0
