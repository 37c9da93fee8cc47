"""The whole stack as real processes on the per-test NATS and Redis servers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from unicron.cli.stack import Stack, StackConfig
from unicron.shared.procs import free_port

from tests.waiting import wait_for

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture
def stack(nats_url: str, redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    config = StackConfig(
        nodes=2,
        slots=2,
        nats_url=nats_url,
        redis_url=redis_url,
        api_port=free_port(),
        data_dir=tmp_path / "stack",
    )
    with Stack(config) as running:
        yield running


@pytest.fixture
def api(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.api_url, timeout=10) as client:
        yield client


def small_job(name: str, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "steps": 40,
        "global_batch": 8,
        "micro_batch": 2,
        "min_workers": 1,
        "max_workers": 4,
        "checkpoint_every": 10,
        "model": {"n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 32, "vocab": 64},
    }
    spec.update(overrides)
    return spec


def get_job(api: httpx.Client, job_id: str) -> dict[str, Any]:
    response = api.get(f"/v1/jobs/{job_id}")
    response.raise_for_status()
    return dict(response.json())


def wait_terminal(api: httpx.Client, job_id: str, timeout_s: float = 120.0) -> dict[str, Any]:
    return dict(
        wait_for(
            f"{job_id} to finish",
            lambda: (job := get_job(api, job_id))["state"] in TERMINAL and job,
            timeout_s,
        )
    )


def failures_of(api: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    """Every ``failure.detected`` of the job in the event history."""
    response = api.get("/v1/events", params={"follow": "false"}, timeout=30)
    assert response.status_code == 200, response.text
    events = [
        json.loads(line.removeprefix("data: "))
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]
    return [
        e["data"]
        for e in events
        if e["type"] == "failure.detected" and e["data"].get("job_id") == job_id
    ]


def assert_no_node_blamed(api: httpx.Client, redis_url: str) -> None:
    """Nothing counted towards a node's quarantine, and every node is still READY."""
    with redis.Redis.from_url(redis_url) as client:
        assert client.keys("unicron:node_failures:*") == []
    assert {n["state"] for n in api.get("/v1/nodes").json()} == {"READY"}
