"""The metric catalogue of docs/design.md §13 against what the services register, and a check
of a PromQL query over it: the metrics it reads are catalogued and the labels it selects or
groups by are theirs (the alerts and dashboard of tests/test_observability.py)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from unicron.services.agent.metrics import AgentMetrics
from unicron.services.api.metrics import ApiMetrics
from unicron.services.detector.metrics import DetectorMetrics
from unicron.services.executor.metrics import ExecutorMetrics
from unicron.services.planner.metrics import PlannerMetrics
from unicron.shared.metrics import ServiceMetrics

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
# prometheus.yml stores a metric's `job` (a training job's id) as `job_id`: Prometheus has its own.
STORED_LABELS = {"job": "job_id"}
# Labels Prometheus itself puts on every series: the scrape job and target.
TARGET_LABELS = {"job", "instance"}


@functools.cache
def catalogue() -> dict[str, frozenset[str]]:
    """metric -> its labels as Prometheus stores them, from docs/design.md §13's catalogue."""
    text = DESIGN.read_text()
    section = text[text.index("## 13. Metrics") :].split("\n## ", 1)[0]
    found = {}
    for names, labels in re.findall(r"^\| (`unicron_[^|]*) \|([^|]*)\|", section, re.M):
        words = re.findall(r"\w+", re.sub(r"\([^)]*\)", "", labels))  # not the (values)
        for name in re.findall(r"`(unicron_\w+)`", names):
            found[name] = frozenset(STORED_LABELS.get(word, word) for word in words)
    assert len(found) >= 20, "docs/design.md's metric catalogue was not found"
    return found


@functools.cache
def exported() -> dict[str, str]:
    """metric -> type, of each metric a service registers, named as the catalogue names it."""
    registries = [ApiMetrics().registry]
    for part in (AgentMetrics, DetectorMetrics, ExecutorMetrics, PlannerMetrics):
        service = ServiceMetrics()
        service.part(part)
        registries.append(service.registry)
    return {
        family.name + ("_total" if family.type == "counter" else ""): family.type
        for registry in registries
        for family in registry.collect()
    }


def series_metric(series: str) -> str | None:
    """The catalogue metric a series belongs to (a histogram's by its _bucket, _count, _sum)."""
    if series in catalogue() and exported().get(series) != "histogram":
        return series
    base = re.sub(r"_(bucket|count|sum)$", "", series)
    return base if base in catalogue() and exported().get(base) == "histogram" else None


def check_query(expr: str) -> None:
    """Each metric a query reads is in the catalogue, or is Prometheus's own `up`, and each
    label it selects or groups by is one those metrics have."""
    series = set(re.findall(r"\bunicron_\w+", expr))
    metrics = {name: series_metric(name) for name in series}
    unknown = sorted(name for name, metric in metrics.items() if metric is None)
    assert not unknown, f"not in the catalogue: {unknown} in {expr}"
    assert series or re.search(r"\bup\{", expr), f"reads no catalogue metric: {expr}"
    labels = set(TARGET_LABELS)
    for metric in filter(None, metrics.values()):
        labels |= catalogue()[metric] | ({"le"} if exported()[metric] == "histogram" else set())
    grouped = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
    used = {label for group in grouped for label in re.findall(r"\w+", group)}
    used |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", expr))
    assert used <= labels, f"labels {sorted(used - labels)} not on the metrics of {expr}"
    if "job_id" in labels:  # then `job`, the scrape job, is a slip for the training job's id
        assert "job" not in used, f"`job` is the scrape job; the training job is `job_id`: {expr}"
