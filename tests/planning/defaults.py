"""The objective the planner service builds from its default settings, from library parts only,
so the model's tests need no service (tests/planner/test_settings.py checks the two agree)."""

from __future__ import annotations

from unicron.planning.api import Objective
from unicron.planning.calibration import LLAMA3_FAILURES_PER_GPU_H
from unicron.planning.costs import ModelledDowntime
from unicron.planning.spec import ClusterSpec
from unicron.planning.throughput import MegatronThroughput


def default_objective(cluster: ClusterSpec) -> Objective:
    """Megatron throughput, modelled downtime, D_run at the Llama 3 rate, the preset's unit."""
    run_s = 3600.0 / LLAMA3_FAILURES_PER_GPU_H
    cost = ModelledDowntime(cluster)
    return Objective(MegatronThroughput(cluster), cost, run_s, cluster.unit_slots)
