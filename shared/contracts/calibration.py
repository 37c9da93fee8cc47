"""The planner's calibration as one exportable record: what the cluster has measured so far.

The planner learns it online (``unicron.services.planner.calibration``) and writes this snapshot to
Redis at every planning pass; ``GET /v1/calibration`` and ``unicron calibration`` export it, and
``unicron simulate --calibration FILE`` reads the same record, so the simulator prices
transitions with exactly the numbers the planner uses. A hand-written file needs only the
fields it sets, e.g. ``{"transition_factors": {"restart": 1.3}}``; an unknown field is an error,
so a typo is never silently ignored.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

# Where the active planner keeps the latest snapshot (one writer: the lease holder).
CALIBRATION_KEY = "unicron:planner:calib:snapshot"


class CalibrationRecord(BaseModel):
    """Measured / modelled ratios and the failure rate, as the planner reads them."""

    model_config = ConfigDict(extra="forbid")

    transition_factors: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="per transition kind (restart, shrink, …): measured / modelled downtime",
    )
    transition_samples: dict[str, int] = Field(
        default_factory=dict, description="how many measured transitions each factor folds in"
    )
    job_slowdown: dict[str, PositiveFloat] = Field(
        default_factory=dict, description="per job: observed / modelled iteration time"
    )
    failure_rate_per_gpu_h: PositiveFloat | None = Field(
        None, description="failures per GPU-hour; D_run = 1 / (rate · GPUs in use)"
    )
    at: float | None = Field(None, description="when the planner computed it (UNIX seconds)")
