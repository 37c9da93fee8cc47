"""Tiny hand-made clusters, jobs and traces for the simulator tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from unicron.simulator.inputs import ClusterConfig, JobConfig
from unicron.simulator.trace import Failure, load_trace


@pytest.fixture
def cluster() -> ClusterConfig:
    return ClusterConfig(nodes=4, gpus_per_node=8, gpu="a100")


@pytest.fixture
def one_job() -> list[JobConfig]:
    return [JobConfig("gpt", 1.3, 1.0, 8, 32)]


@pytest.fixture
def two_jobs() -> list[JobConfig]:
    return [JobConfig("big", 6.7, 2.0, 16, 24), JobConfig("small", 1.3, 1.0, 8, 16)]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def trace_of(tmp_path: Path, rows: str, nodes: int = 4) -> list[Failure]:
    path = write(tmp_path / "trace.csv", "time_s,node,category,repair_s\n" + rows)
    return load_trace(path, nodes)


def cluster_file(tmp_path: Path, nodes: int = 4) -> Path:
    return write(tmp_path / "cluster.json", json.dumps({"nodes": nodes, "gpus_per_node": 8}))
