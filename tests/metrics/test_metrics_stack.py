"""The metrics of every service on the real stack: a worker killed mid-training (and a report
that cannot be read) moves each service's figures on its own /metrics port; a job that loses
every rank, a failure right after a recovery, a service killed holding messages and a GPU's Xid
move the rest (``extended``: variants of the same story, on the same stack)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from unicron.cli.stack import Stack
from unicron.shared.bus.api import Outgoing
from unicron.shared.bus.bus import Bus
from unicron.shared.bus.streams import REPORTS_STREAM

from tests.e2e.conftest import get_job, small_job
from tests.metrics.scrape import Samples, scrape, total, value
from tests.stacks import stack_on_own_servers
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(180)
WORLD = 2  # two slots on one node: the fewest processes for a whole recovery
SERVICES = {"api", "detector", "planner", "executor", "agent-node-0"}
REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "tests" / "agent" / "nvml_shim"
XID_FILE_ENV = "UNICRON_TEST_XID_FILE"
BADPUT, FAILURES = "unicron_job_badput_seconds_total", "unicron_failures_total"
ESCALATIONS, GPU_EVENTS = "unicron_escalations_total", "unicron_gpu_health_events_total"
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("metrics")
    gpu = scripted_nvml(root / "xid")  # node-0's health watch runs on the recorded H200
    # a second failure escalates however fast the machine redoes the first one's lost steps
    calm = {"UNICRON_ESCALATION_STEPS": "100000"}
    with stack_on_own_servers(
        root, nodes=1, slots=2, node_env={"node-0": gpu}, extra_env=calm
    ) as running:
        yield running


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.api_url, timeout=10) as client:
        yield client


def scripted_nvml(xid_file: Path) -> dict[str, str]:
    """The environment that gives an agent process tests/agent/nvml_shim's ``pynvml``."""
    path = os.pathsep.join(p for p in (str(SHIM), str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "UNICRON_GPU_HEALTH_S": "0.5", XID_FILE_ENV: str(xid_file)}


def scrape_all(stack: Stack) -> dict[str, Samples]:
    return {name: scrape(url) for name, url in stack.metrics_urls.items()}


def running(api: httpx.Client, job_id: str, generation: int, step: int) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        job = get_job(api, job_id)
        live = [w for w in job["workers"] if w["state"] == "RUNNING" and w["pid"]]
        stepping = job["state"] == "RUNNING" and job["stepping"] and job["step"] >= step
        return job if stepping and job["generation"] >= generation and len(live) == WORLD else None

    return dict(wait_for(f"{job_id} generation {generation} past step {step}", ready, 90))


def kill(job: dict[str, Any], *ranks: int) -> None:
    for worker in job["workers"]:
        if worker["rank"] in ranks:
            os.kill(worker["pid"], signal.SIGKILL)


@contextlib.contextmanager
def a_job(api: httpx.Client, name: str, **spec: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """A job of its own, training, cancelled at the end so that the next test has the slots."""
    submitted = api.post("/v1/jobs", json=small_job(name, steps=100_000, **spec))
    job_id = str(submitted.raise_for_status().json()["id"])
    try:
        yield job_id, running(api, job_id, generation=1, step=3)
    finally:
        api.post(f"/v1/jobs/{job_id}/cancel")
        wait_for(f"{job_id} ended", lambda: get_job(api, job_id)["state"] in ENDED, 60)


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
    with a_job(api, "metrics") as (job_id, job):
        check_a_killed_worker(stack, api, job_id, job)


def check_a_killed_worker(
    stack: Stack, api: httpx.Client, job_id: str, job: dict[str, Any]
) -> None:
    before = scrape_all(stack)
    kill(job, 1)
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


def grown(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


@pytest.mark.extended
def test_a_job_that_loses_every_rank_redoes_steps_and_a_failure_right_after_escalates(
    stack: Stack, api: httpx.Client
) -> None:
    # No checkpoint after the start, so that a restart redoes every step so far: steps of ~30 ms
    # outran the API's view of them, and a kill meant between two checkpoints could follow one.
    with a_job(api, "rollback", checkpoint_every=100_000) as (job_id, job):
        before = scrape_all(stack)
        kill(job, 0, 1)  # no rank keeps the state: the job restarts from its checkpoint
        job = running(api, job_id, generation=job["generation"] + 1, step=0)
        kill(job, 1)  # the recovery did not hold: the detector grades the answer up
        running(api, job_id, generation=job["generation"] + 1, step=0)

        def moved() -> dict[str, Samples] | None:
            now = scrape_all(stack)
            redone = total(now["executor"], BADPUT, job=job_id, cause="recomputed") > 0
            escalated = grown(before["detector"], now["detector"], "unicron_escalations_total")
            return now if redone and escalated else None

        after = wait_for("recomputed badput and an escalation", moved, 60)
    assert grown(before["detector"], after["detector"], ESCALATIONS, action="reconfigure") == 1
    assert grown(before["executor"], after["executor"], "unicron_recoveries_total") == 2


@pytest.mark.extended
def test_a_service_killed_holding_messages_is_handed_them_again(
    stack: Stack, api: httpx.Client
) -> None:
    with a_job(api, "redelivery") as (job_id, job):
        executor = stack.children["executor"].process
        assert executor is not None
        os.kill(executor.pid, signal.SIGSTOP)  # the server still pushes it the step reports
        try:
            wait_for("reports held by the stopped executor", lambda: held(stack) > 0, 30)
        finally:
            executor.kill()
            executor.wait()
        assert stack.restart_exited() == ["executor"]

        def redelivered() -> float:
            return total(scrape(stack.metrics_urls["executor"]), "unicron_bus_redeliveries_total")

        wait_for("the restarted executor handed the reports again", redelivered, 60,
                 tolerate=(httpx.HTTPError,))  # fmt: skip
        running(api, job_id, generation=job["generation"], step=job["step"] + 3)


def held(stack: Stack) -> int:
    async def ask() -> int:
        bus = await Bus.connect(stack.nats_url, source="unicron/test")
        try:
            info = await bus.js.consumer_info(REPORTS_STREAM, "executor-reports")
            return int(info.num_ack_pending)
        finally:
            await bus.close()

    return asyncio.run(ask())


@pytest.mark.extended
def test_an_xid_is_counted_by_the_agent_and_fails_the_job_on_its_node(
    stack: Stack, api: httpx.Client
) -> None:
    with a_job(api, "xid") as (job_id, _):
        before = scrape_all(stack)
        Path(stack.config.node_env["node-0"][XID_FILE_ENV]).write_text("0 79")  # off the bus

        def moved() -> dict[str, Samples] | None:
            now = scrape_all(stack)
            failed = grown(before["detector"], now["detector"], FAILURES, category="gpu_driver")
            return now if failed else None

        after = wait_for("a GPU driver failure in the detector's metrics", moved, 30)
        failure = wait_for("the job's failure", lambda: get_job(api, job_id)["last_failure"], 30)
    agent = "agent-node-0"
    assert grown(before[agent], after[agent], GPU_EVENTS, event="xid", severity="SEV1") == 1
    assert grown(before["detector"], after["detector"], FAILURES, kind="hardware") == 1
    assert failure["category"] == "gpu_driver" and failure["node_id"] == "node-0"
