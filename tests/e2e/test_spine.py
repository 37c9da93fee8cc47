"""End-to-end: jobs run on real torch workers through agents, and survive worker crashes."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from unicron.cli.stack import Stack

from tests.e2e.conftest import get_job, small_job, wait_for, wait_terminal


@pytest.mark.extended  # every story below runs a job to its end too
def test_job_runs_to_success(api: httpx.Client) -> None:
    job = api.post("/v1/jobs", json=small_job("lifecycle", steps=30)).json()
    assert job["state"] == "PENDING"
    done = wait_terminal(api, job["id"])
    assert done["state"] == "SUCCEEDED", done["history"]
    assert done["step"] == 30
    assert done["world_size"] == 4
    assert done["recoveries"] == 0
    states = [h["state"] for h in done["history"]]
    assert states[0] == "PENDING" and states[-1] == "SUCCEEDED"
    assert "RUNNING" in states
    assert all(w["state"] == "SUCCEEDED" for w in done["workers"])


def _kill_rank(api: httpx.Client, job_id: str, rank: int, at_step: int) -> int:
    job = wait_for(
        f"step {at_step}",
        lambda: (j := get_job(api, job_id))["state"] == "RUNNING" and j["step"] >= at_step and j,
    )
    pid = next(w["pid"] for w in job["workers"] if w["rank"] == rank)
    os.kill(pid, signal.SIGKILL)
    return int(pid)


@pytest.mark.extended  # test_detection.py kills a rank of four on the same stack
def test_sigkilled_worker_is_detected_and_job_finishes(api: httpx.Client) -> None:
    job = api.post("/v1/jobs", json=small_job("crash", steps=60)).json()
    _kill_rank(api, job["id"], rank=1, at_step=15)
    recovering = wait_for(
        "the failure to be recorded",
        lambda: (j := get_job(api, job["id"]))["last_failure"] and j,
    )
    failure = recovering["last_failure"]
    assert (failure["kind"], failure["severity"], failure["action"]) == (
        "crash",
        "SEV2",
        "restart",
    )
    assert failure["rank"] == 1
    done = wait_terminal(api, job["id"])
    assert done["state"] == "SUCCEEDED", done["history"]
    assert done["step"] == 60
    assert done["recoveries"] == 1
    assert "RECOVERING" in [h["state"] for h in done["history"]]


def test_two_jobs_share_the_slots(api: httpx.Client) -> None:
    first = api.post("/v1/jobs", json=small_job("share-a", steps=60, max_workers=2)).json()
    second = api.post("/v1/jobs", json=small_job("share-b", steps=60, max_workers=2)).json()

    def both_running() -> bool:
        jobs = [get_job(api, first["id"]), get_job(api, second["id"])]
        return all(j["state"] == "RUNNING" and j["world_size"] == 2 for j in jobs)

    wait_for("both jobs running on 2 workers each", both_running)
    used = {w["node_id"] for j in (first, second) for w in get_job(api, j["id"])["workers"]}
    assert used == {"node-0", "node-1"}
    for job in (first, second):
        assert wait_terminal(api, job["id"])["state"] == "SUCCEEDED"


# The executor's restart, mid-transition, is the one `make test` keeps: the planner's and the
# detector's are CI's extended suite, and the api, which holds no state of its own (every route
# reads Redis), the slow suite's — to keep `make test` under its 15 minutes.
@pytest.mark.parametrize(
    "service",
    [
        pytest.param("planner", marks=pytest.mark.extended),
        "executor",
        pytest.param("detector", marks=pytest.mark.extended),
        pytest.param("api", marks=pytest.mark.slow),
    ],
)
def test_control_plane_restart_loses_nothing(stack: Stack, service: str) -> None:
    client = httpx.Client(base_url=stack.api_url, timeout=10)
    job = client.post("/v1/jobs", json=small_job(f"restart-{service}", steps=50)).json()
    running = wait_for("job running", lambda: (j := get_job(client, job["id"]))["step"] >= 5 and j)
    child = stack.children[service]
    assert child.process is not None
    child.process.kill()
    child.process.wait()
    if service != "api":  # a fault while the service is down
        os.kill(next(w["pid"] for w in running["workers"] if w["rank"] == 0), signal.SIGKILL)
    time.sleep(0.5)  # the service stays down for a while, as after a real crash
    stack.restart_exited()
    stack.wait_ready(60)
    done = wait_terminal(client, job["id"])
    assert done["state"] == "SUCCEEDED", done["history"]
    assert done["step"] == 50


async def test_malformed_bus_messages_are_dead_lettered_while_jobs_run(
    stack: Stack, nats_url: str
) -> None:
    import asyncio

    from unicron.shared.bus.bus import Bus
    from unicron.shared.contracts.messages import DeadLetter

    bus = await Bus.connect(nats_url, source="unicron/test")
    letters: asyncio.Queue[DeadLetter] = asyncio.Queue()
    await bus.consume("unicron.deadletter", "test-dl", DeadLetter.model_validate_json, letters.put)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as client:
        job = (await client.post("/v1/jobs", json=small_job("dead-letter", steps=20))).json()
        await bus.js.publish("unicron.events.plan.created", b'{"garbage": true}')
        await bus.js.publish("unicron.reports.node-0.worker_exited", b"not json at all")
        services: set[str] = set()
        while len(services) < 3:  # planner + executor read plan.created; detector, executor reports
            letter = await asyncio.wait_for(letters.get(), 30)
            services.add(letter.service)
        assert {"unicron/executor", "unicron/detector"} <= services
        for _ in range(600):
            current = (await client.get(f"/v1/jobs/{job['id']}")).json()
            if current["state"] == "SUCCEEDED":
                break
            await asyncio.sleep(0.2)
        assert current["state"] == "SUCCEEDED", current
    await bus.close()
