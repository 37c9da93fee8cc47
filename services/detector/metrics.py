"""The detector's metrics: each ``failure.detected`` it publishes, counted by kind, category and
severity, how long after the fault was observed it was published, and the escalations it
decided (a failure of a generation whose recovery did not hold, graded one action up).

Watched on the bus as the events are published (:meth:`ServiceMetrics.watch`), so every path
that reports a failure — a worker's report, a node loss, a GPU fault, the reconcile — counts.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram
from unicron.shared.contracts.events import EventData, FailureDetected
from unicron.shared.metrics import ServiceMetrics

# Fault observed -> failure.detected: tens of milliseconds in band, seconds for a lost node.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class DetectorMetrics:
    def __init__(self, metrics: ServiceMetrics) -> None:
        registry = metrics.registry
        self.failures = Counter(
            "unicron_failures", "Failures detected (failure.detected published)",
            ["kind", "category", "severity"], registry=registry,
        )  # fmt: skip
        self.latency = Histogram(
            "unicron_detection_latency_seconds",
            "Fault observed (the report's time) -> failure.detected published",
            ["kind"], buckets=LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.escalations = Counter(
            "unicron_escalations", "Failed recoveries escalated, by the action escalated to",
            ["action"], registry=registry,
        )  # fmt: skip
        metrics.watch(self.published)

    def published(self, data: EventData) -> None:
        if not isinstance(data, FailureDetected):
            return
        kind = data.kind.value
        self.failures.labels(kind, data.category.value, data.severity.value).inc()
        self.latency.labels(kind).observe(max(0.0, data.detected_at - data.observed_at))
        if "escalated_from" in data.evidence:
            self.escalations.labels(data.action.value).inc()
