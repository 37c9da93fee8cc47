"""The metrics of every service on the real stack: a worker killed mid-training (and a report
that cannot be read) moves each service's figures on its own /metrics port."""

from __future__ import annotations

import asyncio
import math
import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from unicron.cli.stack import Stack
from unicron.shared.bus.api import Outgoing
from unicron.shared.bus.bus import Bus

from tests.e2e.conftest import get_job, small_job
from tests.metrics.scrape import Samples, scrape, total, value
from tests.stacks import stack_on_own_servers
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(180)
WORLD = 2  # two slots on one node: the fewest processes for a whole recovery
SERVICES = {"api", "detector", "planner", "executor", "agent-node-0"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with stack_on_own_servers(tmp_path_factory.mktemp("metrics"), nodes=1, slots=2) as running:
        yield running


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.api_url, timeout=10) as client:
        yield client


def scrape_all(stack: Stack) -> dict[str, Samples]:
    return {name: scrape(url) for name, url in stack.metrics_urls.items()}


def running(api: httpx.Client, job_id: str, generation: int, step: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        job = get_job(api, job_id)
        live = [w for w in job["workers"] if w["state"] == "RUNNING" and w["pid"]]
        stepping = job["state"] == "RUNNING" and job["stepping"] and job["step"] >= step
        return job if stepping and job["generation"] >= generation and len(live) == WORLD else None

    return dict(wait_for(f"{job_id} generation {generation} past step {step}", ready, 90))


async def send_garbage(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, source="unicron/test")
    try:
        await bus.send(Outgoing("unicron.reports.node-0.worker_exited", b"not a report"))
    finally:
        await bus.close()


def test_a_killed_worker_moves_the_metrics_of_every_service(
    stack: Stack, api: httpx.Client
) -> None:
    assert set(stack.metrics_urls) == SERVICES
    submitted = api.post("/v1/jobs", json=small_job("metrics", steps=100_000))
    job_id = str(submitted.raise_for_status().json()["id"])
    job = running(api, job_id, generation=1, step=3)
    before = scrape_all(stack)
    os.kill(next(w["pid"] for w in job["workers"] if w["rank"] == 1), signal.SIGKILL)
    asyncio.run(send_garbage(stack.nats_url))
    running(api, job_id, generation=job["generation"] + 1, step=job["step"] + 2)

    def moved() -> dict[str, Samples] | None:
        now = scrape_all(stack)
        recovered = total(now["executor"], "unicron_recoveries_total") > total(
            before["executor"], "unicron_recoveries_total"
        )
        return now if recovered and value(now["planner"], "unicron_waf", kind="achieved") else None

    after = wait_for("the recovery and an achieved WAF in the metrics", moved, 30)

    def grew(service: str, name: str, **labels: str) -> float:
        return total(after[service], name, **labels) - total(before[service], name, **labels)

    detector, planner, executor = after["detector"], after["planner"], after["executor"]
    assert grew("detector", "unicron_failures_total", kind="crash") == 1
    assert grew("detector", "unicron_detection_latency_seconds_count", kind="crash") == 1
    assert grew("detector", "unicron_job_state_changes_total", state="RECOVERING") == 1
    assert value(detector, "unicron_dead_letters_total", service="detector") >= 1
    assert grew("planner", "unicron_failure_actions_total", action="restart") == 1
    assert grew("planner", "unicron_planner_pass_seconds_count") >= 1
    assert value(planner, "unicron_waf", kind="predicted") > 0
    assert grew("executor", "unicron_recoveries_total") == 1
    assert grew("executor", "unicron_recovery_downtime_seconds_count") == 1
    assert grew("executor", "unicron_job_state_changes_total", state="RUNNING") >= 1
    for cause in ("detection", "recovery"):
        assert grew("executor", "unicron_job_badput_seconds_total", job=job_id, cause=cause) > 0
    assert value(executor, "unicron_job_badput_seconds_total", job=job_id, cause="waiting") > 0
    assert grew("executor", "unicron_job_goodput_seconds_total", job=job_id) > 0
    assert value(executor, "unicron_job_steps_per_second", job=job_id) > 0
    assert math.isfinite(value(executor, "unicron_job_loss", job=job_id))
    assert value(after["api"], "unicron_nodes", state="READY") == 1
    assert value(after["api"], "unicron_jobs", state="RUNNING") == 1
    for name in ("detector", "planner", "executor", "agent-node-0"):
        lags = [k for k in after[name] if k[0] == "unicron_bus_consumer_pending_messages"]
        assert lags, f"{name} reports no consumer lag"
    assert ("unicron_spares_ready", frozenset()) in after["agent-node-0"]
