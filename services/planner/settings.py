"""The planner's settings (``UNICRON_PLANNER_*`` environment variables) and its objective."""

from __future__ import annotations

import json
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator
from unicron.planning.api import Objective, TransitionCost
from unicron.planning.calibration import LLAMA3_FAILURES_PER_GPU_H
from unicron.planning.clusters import CLUSTERS
from unicron.planning.costs import ConstantDowntime, ModelledDowntime
from unicron.planning.fairness import PlanRules, TenantQuotas
from unicron.planning.spec import ClusterSpec
from unicron.planning.throughput import THROUGHPUT_MODELS
from unicron.services.planner.calibration import FailurePrior
from unicron.shared.contracts.plans import Fairness
from unicron.shared.settings import CommonSettings


def quotas_of(text: str) -> TenantQuotas:
    """``UNICRON_TENANT_QUOTAS`` parsed; ValueError says what is wrong with it."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"UNICRON_TENANT_QUOTAS is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError('UNICRON_TENANT_QUOTAS must be a JSON object like {"team-a": 16}')
    try:
        return TenantQuotas.parse(raw)
    except ValueError as exc:
        raise ValueError(f"UNICRON_TENANT_QUOTAS: {exc}") from None


class PlannerSettings(CommonSettings):
    metrics_port: int = Field(9102, ge=0, le=65535)  # /metrics (0: off)
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
    planner_lease_ttl_s: float = Field(1.5, gt=0)
    # Set by a supervisor that never runs two of it at once (unicron up): a restarted planner
    # of this instance takes its dead predecessor's lease at once (shared/store/lease.py).
    planner_instance: str | None = Field(None, min_length=1, max_length=128)
    # Against starvation (planning/fairness.py): waf, aging or guaranteed_min. Aging:
    # a job that waited planner_aging_s counts twice, counted in whole steps of the clock.
    planner_fairness: Fairness = Fairness.WAF
    planner_aging_s: float = Field(86400.0, gt=0, allow_inf_nan=False)
    planner_aging_step_s: float = Field(4 * 3600.0, gt=0, allow_inf_nan=False)
    # ``UNICRON_TENANT_QUOTAS``: JSON {"team-a": 16, "*": 64}, the slots all of a tenant's jobs
    # may hold together ("*": any tenant not named; none: unlimited), a multiple of the unit.
    tenant_quotas: str = "{}"

    @field_validator("tenant_quotas")
    @classmethod
    def _quotas_parse(cls, raw: str) -> str:
        quotas_of(raw)  # a bad entry raises, naming it
        return raw

    @model_validator(mode="after")
    def _quotas_in_units(self) -> Self:
        unit = self.unit_slots
        for quota in self.quotas.all():
            if quota % unit:
                raise ValueError(f"UNICRON_TENANT_QUOTAS: {quota} slots is not a multiple of "
                                 f"the {unit} slots the planner hands out at once")  # fmt: skip
        return self

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

    @property
    def unit_slots(self) -> int:
        return self.planner_unit_slots or self.cluster.unit_slots

    @property
    def quotas(self) -> TenantQuotas:
        return quotas_of(self.tenant_quotas)

    def rules(self) -> PlanRules:
        return PlanRules(
            self.planner_fairness, self.planner_aging_s, self.planner_aging_step_s, self.quotas
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
        return Objective(throughput, self.cost(), run_s, self.unit_slots)
