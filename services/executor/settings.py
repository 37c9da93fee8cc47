"""Executor settings (``UNICRON_*`` environment variables)."""

from __future__ import annotations

from pydantic import Field
from unicron.shared.settings import CommonSettings


class ExecutorSettings(CommonSettings):
    metrics_port: int = Field(9103, ge=0, le=65535)  # /metrics (0: off)
    reconcile_interval_s: float = 2.0
    launch_timeout_s: float = 20.0
    max_recoveries: int = 20
    # an in-place transition that has not stepped by then falls back to the checkpoint
    regroup_timeout_s: float = 30.0
    # a reattempt or a crashed rank's restart on the job's own nodes is carried out at once from
    # the standing plan, without waiting for the planner (services/executor/fastpath.py)
    fast_path: bool = True
    # One active executor (shared/terms.py): the lease's TTL bounds how long a dead one keeps
    # its standby waiting; a restarted process of the same instance takes it back at once.
    executor_lease_ttl_s: float = Field(1.5, gt=0)
    executor_instance: str | None = Field(None, min_length=1, max_length=128)
