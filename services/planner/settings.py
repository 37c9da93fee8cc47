"""The planner's settings (``UNICRON_PLANNER_*`` environment variables) and its objective."""

from __future__ import annotations

from pydantic import Field

from services.planner.api import Objective
from services.planner.costs import ConstantDowntime
from services.planner.throughput import LinearThroughput
from shared.settings import CommonSettings


class PlannerSettings(CommonSettings):
    # D_run: expected seconds until the next failure, over which a new allocation pays off.
    planner_run_s: float = Field(3600.0, gt=0)
    # D_trans per action: seconds of a job's work lost to the transition.
    planner_restart_s: float = Field(10.0, ge=0)
    planner_resize_s: float = Field(10.0, ge=0)
    planner_start_s: float = Field(0.0, ge=0)
    planner_worker_throughput: float = Field(1.0, gt=0)
    # Slots the DP hands out at once (a node's slots for whole-node allocations).
    planner_unit_slots: int = Field(1, ge=1)
    # A burst of triggers within this window yields one plan.
    planner_debounce_s: float = Field(0.1, ge=0)
    # Re-read the cluster this often and re-plan if it changed (missed events, restarts).
    planner_reconcile_s: float = Field(2.0, gt=0)

    def objective(self) -> Objective:
        return Objective(
            throughput=LinearThroughput(self.planner_worker_throughput),
            cost=ConstantDowntime(
                restart_s=self.planner_restart_s,
                resize_s=self.planner_resize_s,
                start_s=self.planner_start_s,
            ),
            run_s=self.planner_run_s,
            unit=self.planner_unit_slots,
        )
