"""The state of each node and each job as a Prometheus gauge, so an alert can name them.

``unicron_node_state{node_id, state}`` and ``unicron_job_state{job, name, state}`` are 1 for
the one state each node or job is in now; ``unicron_gpu_retired{node_id, gpu, fault}`` is 1 for
each GPU an agent retired after a fault (``NodeRecord.retired_gpus``) until the agent restarts.
They are rebuilt from the API's last read of Redis at each scrape, not kept as labelled
children: a node that changes state or is deleted leaves no series behind, which a
``Gauge.labels(...)`` child would (it lives until removed by hand).

The series stay bounded: one per node (a few thousand at most), one per retired GPU, one per
job that is not finished plus one per job that finished in the last ``ended_jobs_s``
(``UNICRON_METRICS_ENDED_JOBS_S``). Nothing here is per rank or per process.

The node's label is ``node_id``, not ``node``: the Kubernetes scrape config puts ``node`` (the
pod's host) on every target, and Prometheus would rename ours ``exported_node``. The job's is
``job``, as on every per-job metric; ``prometheus.yml`` stores it as ``job_id``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from unicron.shared.contracts.models import JobSummary, NodeRecord
from unicron.shared.store.jobindex import finished_at

ENDED_JOBS_S = 3600.0  # UNICRON_METRICS_ENDED_JOBS_S
NODE_STATE = "unicron_node_state"
JOB_STATE = "unicron_job_state"
GPU_RETIRED = "unicron_gpu_retired"


class StateCollector(Collector):
    """The per-node and per-job state gauges, from the last nodes and jobs it was given."""

    def __init__(self, ended_jobs_s: float = ENDED_JOBS_S) -> None:
        self.ended_jobs_s = ended_jobs_s
        self._nodes: list[tuple[str, str]] = []
        self._retired: list[tuple[str, str, str]] = []
        self._jobs: list[tuple[str, str, str]] = []

    def set_nodes(self, nodes: Sequence[NodeRecord]) -> None:
        """Replace the nodes shown: those not in ``nodes`` are no longer scraped."""
        self._nodes = [(node.id, node.state.value) for node in nodes]
        self._retired = [
            (node.id, gpu, fault) for node in nodes for gpu, fault in node.retired_gpus.items()
        ]

    def set_jobs(self, jobs: Sequence[JobSummary], now: float | None = None) -> None:
        """Replace the jobs shown with those of ``jobs`` that are not finished or finished
        within ``ended_jobs_s`` of ``now``: an old one drops out, so its series ends."""
        since = (time.time() if now is None else now) - self.ended_jobs_s
        self._jobs = [
            (job.id, job.name, job.state.value)
            for job in jobs
            if (ended := finished_at(job)) is None or ended >= since
        ]

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        retired = GaugeMetricFamily(
            GPU_RETIRED, "1 for each GPU an agent retired after a fault, until it restarts",
            labels=["node_id", "gpu", "fault"],
        )  # fmt: skip
        nodes = GaugeMetricFamily(
            NODE_STATE, "1 for each node's present state, read from Redis when scraped",
            labels=["node_id", "state"],
        )  # fmt: skip
        jobs = GaugeMetricFamily(
            JOB_STATE,
            "1 for each job's present state (unfinished jobs, and those that finished within "
            "UNICRON_METRICS_ENDED_JOBS_S), read from Redis when scraped",
            labels=["job", "name", "state"],
        )
        return nodes, jobs, retired

    def describe(self) -> Iterator[Metric]:
        """The names alone, so the registry refuses a second metric of the same name."""
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        nodes, jobs, retired = self._families()
        for node_id, state in self._nodes:
            nodes.add_metric([node_id, state], 1)
        for job_id, name, state in self._jobs:
            jobs.add_metric([job_id, name, state], 1)
        for labels in self._retired:
            retired.add_metric(list(labels), 1)
        yield from (nodes, jobs, retired)
