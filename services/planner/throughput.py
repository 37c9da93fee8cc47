"""Throughput models: T(t, x) for each worker count.

Today one model, linear in workers (data parallelism with perfect scaling). The calibrated
model of DESIGN.md §4 (best TP/PP/DP and micro-batch per count, fitted to the iteration times
workers report) will be another :class:`~services.planner.api.ThroughputModel` beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.planner.api import FloatArray, IntArray, JobDemand


@dataclass(frozen=True)
class LinearThroughput:
    """T(t, x) = x · per_worker for min ≤ x; 0 below the job's minimum (it cannot run)."""

    per_worker: float = 1.0

    def throughput(self, demand: JobDemand, workers: IntArray) -> FloatArray:
        runs = workers >= demand.min_workers
        return np.where(runs, workers * self.per_worker, 0.0).astype(np.float64)
