"""The API's per-node and per-job state gauges (services/api/state_metrics.py): one series per
node and per recent job, for its present state only, rebuilt at each scrape, so an alert can
name the node or job and no series outlives what it describes."""

from __future__ import annotations

import pytest
from prometheus_client import Gauge
from unicron.services.api.app import create_app
from unicron.services.api.metrics import ApiMetrics
from unicron.services.api.settings import ApiSettings
from unicron.shared.contracts.models import JobSpec, JobState, JobSummary, NodeRecord, NodeState

from tests.metrics.scrape import Samples, parse, value

NOW = 1_800_000_000.0
HOUR = 3600.0


def node(node_id: str, state: NodeState = NodeState.READY) -> NodeRecord:
    return NodeRecord(id=node_id, state=state, slots=8)


def job(job_id: str, state: JobState, since: float = NOW, name: str = "llama") -> JobSummary:
    spec = JobSpec(name=name)
    return JobSummary(id=job_id, name=name, spec=spec, state=state, state_since=since)


def samples(metrics: ApiMetrics) -> Samples:
    return parse(metrics.render().decode())


def series(got: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in got.items() if n == name}


def node_states(metrics: ApiMetrics) -> dict[str, str]:
    """node -> its state, from the scraped unicron_node_state series (each must be 1)."""
    found = series(samples(metrics), "unicron_node_state")
    assert set(found.values()) <= {1.0}
    states = [dict(labels) for labels in found]
    assert len({s["node_id"] for s in states}) == len(states), f"a node has two series: {states}"
    return {s["node_id"]: s["state"] for s in states}


def job_states(metrics: ApiMetrics) -> dict[str, str]:
    found = series(samples(metrics), "unicron_job_state")
    assert set(found.values()) <= {1.0}
    return {dict(labels)["job"]: dict(labels)["state"] for labels in found}


def test_a_node_that_changes_state_leaves_exactly_one_series() -> None:
    metrics = ApiMetrics()
    metrics.set_nodes([node("gpu-17"), node("gpu-18")])
    assert node_states(metrics) == {"gpu-17": "READY", "gpu-18": "READY"}
    metrics.set_nodes([node("gpu-17", NodeState.QUARANTINED), node("gpu-18")])
    assert node_states(metrics) == {"gpu-17": "QUARANTINED", "gpu-18": "READY"}
    metrics.set_nodes([node("gpu-17", NodeState.READY), node("gpu-18", NodeState.LOST)])
    assert node_states(metrics) == {"gpu-17": "READY", "gpu-18": "LOST"}


def test_a_deleted_node_leaves_no_series_and_the_counts_stay() -> None:
    metrics = ApiMetrics()
    metrics.set_nodes([node("gpu-17", NodeState.LOST), node("gpu-18")])
    metrics.set_nodes([node("gpu-18")])
    assert node_states(metrics) == {"gpu-18": "READY"}
    got = samples(metrics)
    assert value(got, "unicron_nodes", state="READY") == 1
    assert value(got, "unicron_nodes", state="LOST") == 0
    metrics.set_nodes([])
    assert node_states(metrics) == {}


def test_the_job_series_names_the_job_and_its_state() -> None:
    metrics = ApiMetrics()
    metrics.set_jobs([job("job-1", JobState.RUNNING, name="llama-70b")])
    got = samples(metrics)
    labels = {"job": "job-1", "name": "llama-70b", "state": "RUNNING"}
    assert series(got, "unicron_job_state") == {frozenset(labels.items()): 1.0}
    assert value(got, "unicron_jobs", state="RUNNING") == 1
    metrics.set_jobs([job("job-1", JobState.FAILED, name="llama-70b")])
    assert job_states(metrics) == {"job-1": "FAILED"}


def test_a_job_that_ended_before_the_window_drops_out() -> None:
    metrics = ApiMetrics(ended_jobs_s=HOUR)
    jobs = [
        job("running", JobState.RUNNING, since=NOW - 10 * HOUR),  # unfinished: always shown
        job("pending", JobState.PENDING, since=NOW - 10 * HOUR),
        job("failed-now", JobState.FAILED, since=NOW - 60),
        job("cancelled-now", JobState.CANCELLED, since=NOW - HOUR + 1),
        job("failed-old", JobState.FAILED, since=NOW - HOUR - 1),
        job("succeeded-old", JobState.SUCCEEDED, since=NOW - 2 * HOUR),
    ]
    metrics.states.set_jobs(jobs, now=NOW)
    assert job_states(metrics) == {
        "running": "RUNNING", "pending": "PENDING", "failed-now": "FAILED",
        "cancelled-now": "CANCELLED",
    }  # fmt: skip
    metrics.states.set_jobs(jobs, now=NOW + HOUR)  # an hour on, the recent ones are old too
    assert job_states(metrics) == {"running": "RUNNING", "pending": "PENDING"}


def test_a_zero_window_shows_unfinished_jobs_only() -> None:
    metrics = ApiMetrics(ended_jobs_s=0)
    metrics.states.set_jobs(
        [job("a", JobState.RECOVERING), job("b", JobState.SUCCEEDED, since=NOW - 1)], now=NOW
    )
    assert job_states(metrics) == {"a": "RECOVERING"}


def test_the_window_is_a_setting_of_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ApiSettings().metrics_ended_jobs_s == HOUR
    monkeypatch.setenv("UNICRON_METRICS_ENDED_JOBS_S", "600")
    app = create_app(ApiSettings())
    assert app.state.metrics.states.ended_jobs_s == 600
    monkeypatch.setenv("UNICRON_METRICS_ENDED_JOBS_S", "-1")
    with pytest.raises(ValueError):
        ApiSettings()


def test_a_metric_of_the_same_name_is_refused() -> None:
    """The collector describes its names, so the registry catches a collision at start."""
    metrics = ApiMetrics()
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Gauge("unicron_node_state", "again", registry=metrics.registry)


def test_a_retired_gpu_is_a_series_naming_the_node_gpu_and_fault_until_it_is_back() -> None:
    metrics = ApiMetrics()
    why = "Xid 79: the GPU has fallen off the bus"
    metrics.set_nodes(
        [NodeRecord(id="gpu-17", slots=7, gpus=8, retired_gpus={"3": why}), node("gpu-18")]
    )
    labels = {"node_id": "gpu-17", "gpu": "3", "fault": why}
    assert series(samples(metrics), "unicron_gpu_retired") == {frozenset(labels.items()): 1.0}
    metrics.set_nodes([node("gpu-17"), node("gpu-18")])  # its agent restarted after a reset
    assert series(samples(metrics), "unicron_gpu_retired") == {}
