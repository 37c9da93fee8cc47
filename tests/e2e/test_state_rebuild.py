"""A Redis restart on the real stack, with its data and after it lost it: the control plane
rebuilds from the agents and the bus within 10 s, no worker is orphaned, no slot is given twice,
and the job ends as it would have without the restart (docs/design.md §6)."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from unicron.cli.stack import Stack
from unicron.shared.servers.embedded import EmbeddedServer

from tests.e2e.conftest import TERMINAL, get_job, small_job, wait_for, wait_terminal

REBUILD_BUDGET_S = 10.0
STEPS = 150


class SlotWatch:
    """Samples every node's workers in the background: none may run more than its slots."""

    def __init__(self, base_url: str) -> None:
        self.overcommits: list[tuple[str, int, int]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(base_url,), daemon=True)

    def _run(self, base_url: str) -> None:
        with httpx.Client(base_url=base_url, timeout=2) as client:
            while not self._stop.wait(0.1):
                try:
                    response = client.get("/v1/nodes")
                except httpx.HTTPError:
                    continue
                if response.status_code != 200:
                    continue  # 503 while Redis is away
                self.samples += 1
                for node in response.json():
                    if len(node["workers"]) > node["slots"]:
                        self.overcommits.append((node["id"], len(node["workers"]), node["slots"]))

    def __enter__(self) -> SlotWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def orphans(api: httpx.Client) -> list[dict[str, Any]]:
    """Workers the agents run that no job's current generation claims."""
    found = []
    for node in api.get("/v1/nodes").raise_for_status().json():
        for worker in node["workers"]:
            response = api.get(f"/v1/jobs/{worker['job_id']}")
            job = response.json() if response.status_code == 200 else {"state": "missing"}
            if (
                job["state"] not in TERMINAL | {"missing"}
                and worker["generation"] == job["generation"]
            ):
                continue
            found.append({**worker, "node_id": node["id"]})
    return found


def running_job(api: httpx.Client, name: str) -> dict[str, Any]:
    job = api.post("/v1/jobs", json=small_job(name, steps=STEPS)).raise_for_status().json()
    return dict(
        wait_for(
            f"{name} running on every slot",
            lambda: (j := get_job(api, job["id"]))["step"] >= 5 and j["world_size"] == 4 and j,
            120,
        )
    )


def restart_redis(server: EmbeddedServer, wipe: bool) -> float:
    """kill -9 the server, optionally delete its data, start it again; when it listens."""
    server.process.kill()
    server.process.wait()
    if wipe:
        workdir = Path(server.cmd[server.cmd.index("--dir") + 1])
        shutil.rmtree(workdir)
        workdir.mkdir()
    server.restart()
    return time.monotonic()


def submit_when_served(api: httpx.Client, spec: dict[str, Any]) -> dict[str, Any]:
    """Submit as a client would: again (same Idempotency-Key) while the API answers 503."""

    def submitted() -> dict[str, Any] | None:
        response = api.post("/v1/jobs", json=spec, headers={"Idempotency-Key": spec["name"]})
        return None if response.status_code == 503 else dict(response.raise_for_status().json())

    return dict(wait_for("the API to take a job", submitted, 30, interval_s=0.05))


def job_back(api: httpx.Client, job_id: str, since: float) -> tuple[dict[str, Any], float]:
    """The job as soon as the API serves it again, and how long after ``since`` that was."""

    def served() -> dict[str, Any] | None:
        try:
            response = api.get(f"/v1/jobs/{job_id}")
        except httpx.HTTPError:
            return None
        return dict(response.json()) if response.status_code == 200 else None

    job = wait_for(f"{job_id} served again", served, 30, interval_s=0.05)
    return job, time.monotonic() - since


@pytest.mark.slow
def test_a_redis_restarted_with_its_data_changes_nothing(
    api: httpx.Client, stack: Stack, redis_server: EmbeddedServer
) -> None:
    job = running_job(api, "kept")
    with SlotWatch(stack.api_url) as slots:
        back_at = restart_redis(redis_server, wipe=False)
        again, took_s = job_back(api, job["id"], back_at)
        print(f"\njob served again {took_s:.2f} s after Redis restarted with its data")
        assert again["generation"] >= job["generation"]
        done = wait_terminal(api, job["id"], 180)
    assert done["state"] == "SUCCEEDED" and done["step"] == STEPS, done["history"]
    wait_for("the finished workers gone", lambda: not orphans(api), 5)  # a heartbeat's lag
    assert slots.overcommits == [] and slots.samples > 0


@pytest.mark.slow
def test_a_redis_that_lost_its_data_is_rebuilt_from_the_agents_and_the_bus(
    api: httpx.Client, stack: Stack, redis_server: EmbeddedServer
) -> None:
    job = running_job(api, "rebuilt")
    with SlotWatch(stack.api_url) as slots:
        back_at = restart_redis(redis_server, wipe=True)
        # submitted before the rebuild: the planner must count the first job's workers, whose
        # record is not back yet, as holding their slots
        late = submit_when_served(api, small_job("late", steps=20))
        rebuilt, took_s = job_back(api, job["id"], back_at)
        print(f"\njob record rebuilt {took_s:.2f} s after Redis restarted without its data")
        assert took_s < REBUILD_BUDGET_S
        assert (rebuilt["name"], rebuilt["spec"]) == (job["name"], job["spec"])
        assert rebuilt["state"] in ("RUNNING", "RECOVERING")
        assert rebuilt["generation"] >= job["generation"]
        wait_for("no orphaned worker", lambda: not orphans(api), REBUILD_BUDGET_S)
        done = wait_terminal(api, job["id"], 180)
        other = wait_terminal(api, late["id"], 120)
    assert done["state"] == "SUCCEEDED" and done["step"] == STEPS, done["history"]
    assert other["state"] == "SUCCEEDED", other["history"]
    wait_for("the finished workers gone", lambda: not orphans(api), 5)  # a heartbeat's lag
    assert slots.overcommits == [] and slots.samples > 0
