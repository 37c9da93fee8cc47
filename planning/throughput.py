"""Throughput models: T(t, x) for each worker count, with the configuration behind it.

- ``linear``: x · per_worker (data parallelism with perfect scaling); no notion of time.
- ``megatron``: the performance model of :mod:`.perf` on a cluster preset — the best
  (TP, PP, DP, micro-batch) for each x under the memory limit — divided by the job's
  ``slowdown``, the ratio of its observed to its modelled iteration time (calibration).

Both are registered in ``THROUGHPUT_MODELS`` by name, as factories of a cluster preset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from unicron.planning.api import Curve, FloatArray, IntArray, JobDemand, ThroughputModel
from unicron.planning.perf import Workload, achieved_flops, best_configs
from unicron.planning.spec import DEFAULT_SHAPE, ClusterSpec, Registry

ThroughputFactory = Callable[[ClusterSpec], ThroughputModel]
THROUGHPUT_MODELS: Registry[ThroughputFactory] = Registry("throughput model")


@dataclass(frozen=True)
class LinearThroughput:
    """T(t, x) = x · per_worker for min ≤ x; 0 below the job's minimum (it cannot run)."""

    per_worker: float = 1.0

    def throughput(self, demand: JobDemand, workers: IntArray) -> FloatArray:
        runs = workers >= demand.min_workers
        return np.where(runs, workers * self.per_worker, 0.0).astype(np.float64)

    def curve(self, demand: JobDemand, workers: IntArray) -> Curve:
        flops = self.throughput(demand, workers)
        ones = np.where(flops > 0, 1, 0).astype(np.int64)
        dp = np.where(flops > 0, workers, 0).astype(np.int64)
        nan = np.full(workers.shape, np.nan)
        mb = ones * demand.micro_batch
        return Curve(workers, flops, nan, ones, ones, dp, mb)


@dataclass(frozen=True)
class MegatronThroughput:
    """The analytic Megatron-LM model of :mod:`.perf` on ``cluster``, calibrated per job."""

    cluster: ClusterSpec

    def workload(self, demand: JobDemand) -> Workload:
        return Workload(demand.shape or DEFAULT_SHAPE, demand.global_batch, demand.micro_batch)

    def curve(self, demand: JobDemand, workers: IntArray) -> Curve:
        work = self.workload(demand)
        best = best_configs(work, self.cluster, tuple(workers.tolist()))
        runs = (workers >= demand.min_workers) & np.isfinite(best.iteration_s)
        iteration = np.where(runs, best.iteration_s * demand.slowdown, np.inf)
        flops = achieved_flops(work, iteration)

        def pick(values: IntArray) -> IntArray:
            return np.where(runs, values, 0)

        return Curve(
            workers, flops, iteration, pick(best.tp), pick(best.pp), pick(best.dp),
            pick(best.micro_batch),
        )  # fmt: skip

    def modelled_iteration_s(self, demand: JobDemand, workers: int) -> float:
        """Uncalibrated step time on ``workers`` (what calibration compares reports with)."""
        best = best_configs(self.workload(demand), self.cluster, (workers,))
        return float(best.iteration_s[0])


THROUGHPUT_MODELS.register("linear", lambda cluster: LinearThroughput())
THROUGHPUT_MODELS.register("megatron", MegatronThroughput)


def throughput(model: ThroughputModel, demand: JobDemand, workers: int) -> float:
    """T(t, x) of one worker count."""
    return float(model.curve(demand, np.array([workers], dtype=np.int64)).flops[0])
