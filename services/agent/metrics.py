"""The agent's metrics: the GPU health events its NVML watch reported, by what it saw and the
severity that calls for, and the warm spares waiting on its node (read when scraped; summed
over the agents by Prometheus)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter, Gauge
from unicron.services.agent.gpuhealth import ReportSink
from unicron.shared.contracts.reports import GpuHealthReport
from unicron.shared.metrics import ServiceMetrics


class AgentMetrics:
    def __init__(self, metrics: ServiceMetrics) -> None:
        self.gpu_events = Counter(
            "unicron_gpu_health_events", "GPU faults the node's health watch reported",
            ["event", "severity"], registry=metrics.registry,
        )  # fmt: skip
        self.spares_ready = Gauge(
            "unicron_spares_ready", "Warm spare workers ready on this node",
            registry=metrics.registry,
        )  # fmt: skip

    def counting(self, sink: ReportSink) -> ReportSink:
        """``sink``, with each report counted on its way."""
        return _Counted(sink, self.gpu_events)

    def spares_from(self, ready: Callable[[], int]) -> None:
        self.spares_ready.set_function(ready)


@dataclass(frozen=True)
class _Counted:
    sink: ReportSink
    events: Counter

    def report(self, report: GpuHealthReport) -> None:
        self.events.labels(report.signal.value, report.severity.value).inc()
        self.sink.report(report)
