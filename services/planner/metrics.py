"""The planner's metrics: how long each planning pass took, the failures it took in by the
action that answers them, and the weighted achieved FLOP/s — predicted by the latest plan, and
achieved: the plan's prediction for each job scaled by the step time the job measured since
the last reconcile tick (a job that did not step meanwhile achieves nothing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from prometheus_client import Counter, Gauge, Histogram
from unicron.shared.contracts.events import EventData, FailureDetected, PlanCreated
from unicron.shared.contracts.plans import JobAllocation, Plan
from unicron.shared.metrics import ServiceMetrics

PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class PlannerMetrics:
    def __init__(self, metrics: ServiceMetrics) -> None:
        registry = metrics.registry
        self.pass_seconds = Histogram(
            "unicron_planner_pass_seconds", "One planning pass: read the cluster, plan, publish",
            buckets=PASS_BUCKETS, registry=registry,
        )  # fmt: skip
        self.actions = Counter(
            "unicron_failure_actions", "Failures the planner took in, by the action answering them",
            ["severity", "action"], registry=registry,
        )  # fmt: skip
        self.waf = Gauge(
            "unicron_waf", "Weighted achieved FLOP/s of all jobs: predicted by the latest plan, "
            "or achieved at the measured step times", ["kind"], registry=registry,
        )  # fmt: skip
        metrics.watch(self.published)

    def published(self, data: EventData) -> None:
        if isinstance(data, PlanCreated):
            self.waf.labels("predicted").set(data.expected_waf)

    def failure_taken(self, failure: FailureDetected) -> None:
        self.actions.labels(failure.severity.value, failure.action.value).inc()

    def achieved(self, plan: Plan | None, step_s: Mapping[str, float]) -> None:
        """Set the achieved WAF from ``plan`` and the mean step time each job measured."""
        allocations = plan.allocations if plan is not None else []
        total = sum(_achieved(a, step_s[a.job_id]) for a in allocations if a.job_id in step_s)
        self.waf.labels("achieved").set(total)


def _achieved(allocation: JobAllocation, measured_s: float) -> float:
    why = allocation.explanation
    if why is None:
        return 0.0
    config = why.new_config or allocation.config
    predicted_s = config.iteration_s if config is not None else None
    if predicted_s is None or not math.isfinite(predicted_s) or predicted_s <= 0 or measured_s <= 0:
        return why.predicted_waf  # no step time to compare: it stepped, as planned
    return why.predicted_waf * predicted_s / measured_s
