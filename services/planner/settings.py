"""The planner's settings (``UNICRON_PLANNER_*`` environment variables) and its objective."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from unicron.services.planner.api import Objective, TransitionCost
from unicron.services.planner.calibration import FailurePrior
from unicron.services.planner.clusters import CLUSTERS
from unicron.services.planner.costs import ConstantDowntime, ModelledDowntime
from unicron.services.planner.spec import ClusterSpec
from unicron.services.planner.throughput import THROUGHPUT_MODELS
from unicron.shared.settings import CommonSettings

# Llama 3 405B: 466 interruptions in 54 days on 16,384 H100 (docs/design.md §7).
LLAMA3_FAILURES_PER_GPU_H = 466 / (54 * 24 * 16384)


class PlannerSettings(CommonSettings):
    # The node kind (a preset of .clusters) and the model of T(t, x) on it.
    planner_cluster: str = "cpu"
    planner_throughput: str = "megatron"
    # Slots the DP hands out at once; default: the preset's (a node of 8 GPUs, 1 CPU slot).
    planner_unit_slots: int | None = Field(None, ge=1)
    # D_run: fixed seconds, or else from the failure rate, starting from the prior below and
    # updated by the failures observed (as many GPU-hours of evidence as the prior's weight).
    planner_run_s: float | None = Field(None, gt=0)
    planner_failure_rate_per_gpu_h: float = Field(LLAMA3_FAILURES_PER_GPU_H, gt=0)
    planner_failure_prior_gpu_h: float = Field(100.0, gt=0)
    planner_failure_half_life_h: float = Field(24.0, gt=0)
    # D_trans: modelled from the preset and calibrated, or constants per change (a baseline).
    planner_cost: Literal["modelled", "constant"] = "modelled"
    planner_restart_s: float = Field(10.0, ge=0)
    planner_resize_s: float = Field(10.0, ge=0)
    planner_start_s: float = Field(0.0, ge=0)
    # EWMA weight of one new sample in the calibration of step times and downtimes.
    planner_calibration_alpha: float = Field(0.2, gt=0, le=1)
    # A burst of triggers within this window yields one plan.
    planner_debounce_s: float = Field(0.1, ge=0)
    # Re-read the cluster this often and re-plan if it changed (missed events, restarts).
    planner_reconcile_s: float = Field(2.0, gt=0)
    # One active planner: the lease's TTL bounds how long a dead one blocks its standby.
    planner_lease_ttl_s: float = Field(3.0, gt=0)

    @property
    def cluster(self) -> ClusterSpec:
        return CLUSTERS.get(self.planner_cluster)

    @property
    def failure_prior(self) -> FailurePrior:
        return FailurePrior(
            self.planner_failure_rate_per_gpu_h,
            self.planner_failure_prior_gpu_h,
            self.planner_failure_half_life_h,
        )

    def cost(self) -> TransitionCost:
        if self.planner_cost == "constant":
            restart, resize = self.planner_restart_s, self.planner_resize_s
            return ConstantDowntime(restart, resize, self.planner_start_s)
        return ModelledDowntime(self.cluster)

    def objective(self) -> Objective:
        """The uncalibrated objective; ``run_s`` stands until a failure rate replaces it."""
        cluster = self.cluster
        throughput = THROUGHPUT_MODELS.get(self.planner_throughput)(cluster)
        run_s = self.planner_run_s or 3600.0 / self.planner_failure_rate_per_gpu_h
        unit = self.planner_unit_slots or cluster.unit_slots
        return Objective(throughput, self.cost(), run_s, unit)
