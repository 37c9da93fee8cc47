"""Plans: one allocation of the cluster's slots to all active jobs, and why the planner chose it.

The planner computes a :class:`Plan` per planning pass; the executor carries it out one
:class:`JobAllocation` at a time, the :class:`~unicron.shared.contracts.models.PlanAction` of each
naming the transition a job needs. ``GET /v1/plans`` shows each job's :class:`JobExplanation` with
the :class:`Alternative` choices that lost. Plans are kept in Redis through
:mod:`unicron.shared.store.state`.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field
from unicron.shared.contracts.models import PlanAction, new_id, now


class Fairness(str, Enum):
    """How the planner keeps jobs from starving (planning/fairness.py)."""

    WAF = "waf"  # Σ G alone
    AGING = "aging"  # a job's weight grows with the time it waited
    GUARANTEED_MIN = "guaranteed_min"  # every admitted job gets its minimum first


class WaitReason(str, Enum):
    """Why a plan gives a job no workers."""

    CANNOT_RUN = "cannot_run"  # no parallel configuration of its model fits its worker range
    CLUSTER_TOO_SMALL = "cluster_too_small"  # its minimum exceeds the cluster's slots
    NODES_UNAVAILABLE = "nodes_unavailable"  # ... the usable slots: nodes are out of service
    TENANT_QUOTA = "tenant_quota"  # its minimum does not fit in its tenant's quota
    BELOW_MINIMUM = "below_minimum"  # the slots left are fewer than its minimum
    LOWER_VALUE = "lower_value"  # the slots it needs earn more in the jobs that run


class ParallelConfig(BaseModel):
    """A job's parallel layout: tensor, pipeline and data-parallel degrees and micro-batch."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    iteration_s: float | None = Field(None, description="predicted seconds per optimizer step")


class Alternative(BaseModel):
    """A choice the planner weighed for one job and rejected, with what it would have earned."""

    workers: int
    config: ParallelConfig | None = None
    predicted_throughput: float = 0.0
    reward: float = Field(description="this job's expected reward G with this choice")
    plan_reward: float = Field(description="expected reward of the best plan making this choice")
    shortfall: float = Field(description="how much less than the chosen plan's reward")


class JobExplanation(BaseModel):
    """Why a job got what a plan gives it (docs/design.md §4 terms, in FLOP/s and seconds)."""

    old_workers: int = 0
    new_workers: int = 0
    old_config: ParallelConfig | None = None
    new_config: ParallelConfig | None = None
    weight: float = 1.0
    predicted_throughput_old: float = 0.0
    predicted_throughput: float = 0.0
    predicted_waf: float = Field(0.0, description="weight times predicted throughput")
    calibration: float = Field(1.0, description="observed / modelled step time of this job")
    transition: str = "none"
    state_source: str = "none"
    predicted_downtime_s: float = 0.0
    predicted_lost_work_s: float = 0.0
    downtime_factor: float = Field(1.0, description="measured / modelled downtime of its kind")
    reward: float = 0.0
    weight_factor: float = Field(
        1.0, description="what the fairness policy multiplied the weight by (aging)"
    )
    guaranteed_workers: int = Field(
        0, description="workers the guaranteed_min policy gave it before maximising WAF"
    )
    alternatives: list[Alternative] = Field(default_factory=list)


class JobAllocation(BaseModel):
    job_id: str
    workers: int
    nodes: list[str] = Field(default_factory=list, description="node id of each rank, by rank")
    action: PlanAction
    generation: int = Field(0, description="the job's generation the plan was computed against")
    previous_workers: int = 0
    reason: str = ""
    predicted_throughput: float = 0.0
    config: ParallelConfig | None = Field(None, description="the parallel layout to run")
    explanation: JobExplanation | None = None
    waiting_reason: WaitReason | None = Field(None, description="why it gets no workers")
    waiting_since: float | None = Field(None, description="when a PENDING job began waiting")


class Plan(BaseModel):
    """One allocation of the whole cluster's slots to all active jobs."""

    id: str = Field(default_factory=lambda: new_id("plan"))
    seq: int = 0
    epoch: int = 0
    created_at: float = Field(default_factory=now)
    trigger: str = ""
    allocations: list[JobAllocation] = Field(default_factory=list)
    free_slots: int = 0
    expected_waf: float = 0.0
    expected_reward: float = Field(0.0, description="Σ G over the jobs: the DP's objective")
    cluster: str = Field("", description="the cluster preset the models describe")
    unit_slots: int = Field(1, description="slots the DP handed out at a time")
    run_s: float = Field(0.0, description="D_run: expected seconds to the next failure")
    failure_rate_per_gpu_h: float | None = None
    planning_ms: float = 0.0
    fairness: Fairness = Field(Fairness.WAF, description="the planner's policy against starvation")

    def for_job(self, job_id: str) -> JobAllocation | None:
        return next((a for a in self.allocations if a.job_id == job_id), None)
