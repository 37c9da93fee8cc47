"""Reading a ``/metrics`` page as Prometheus does, one sample value by name and labels."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(url: str) -> Samples:
    response = httpx.get(url, timeout=5)
    response.raise_for_status()
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels``; 0 when absent (a counter not moved yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)
