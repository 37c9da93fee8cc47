"""Transition costs: D_trans(t, x_old → x), the seconds of work a change costs a job.

Today a constant per kind of action. Calibrated costs (state transfer size, peers available,
spare processes) will be another :class:`~services.planner.api.TransitionCost` beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.planner.api import FloatArray, IntArray, JobDemand


@dataclass(frozen=True)
class ConstantDowntime:
    """A fixed downtime per action: restart when hit, start from nothing, resize otherwise."""

    restart_s: float = 10.0
    resize_s: float = 10.0
    start_s: float = 0.0

    def downtime(self, demand: JobDemand, workers: IntArray) -> FloatArray:
        if demand.hit:
            # A faulted job restarts whatever it gets, so every choice pays the same.
            return np.full(workers.shape, self.restart_s, dtype=np.float64)
        change = self.start_s if demand.current == 0 else self.resize_s
        return np.where(workers == demand.current, 0.0, change).astype(np.float64)
