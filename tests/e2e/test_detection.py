"""End-to-end detection on real workers: one failure per fault, named right, and the job heals."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from unicron.cli.stack import Stack
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.contracts.events import CloudEvent

from tests.e2e.conftest import small_job

pytestmark = pytest.mark.timeout(240)


class Watch:
    """The stack's REST API plus its event stream, awaited with timeouts."""

    def __init__(self, api: httpx.AsyncClient, events: asyncio.Queue[CloudEvent]) -> None:
        self.api = api
        self.events = events
        self.seen: list[CloudEvent] = []

    async def job(self, job_id: str) -> dict[str, Any]:
        return dict((await self.api.get(f"/v1/jobs/{job_id}")).raise_for_status().json())

    async def until(self, job_id: str, check: Any, timeout_s: float = 120.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout_s):
            # Job records have no push channel of their own; the API is polled, bounded.
            while not check(job := await self.job(job_id)):  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        return job

    async def submit(self, name: str, steps: int) -> str:
        response = await self.api.post("/v1/jobs", json=small_job(name, steps=steps))
        return str(response.raise_for_status().json()["id"])

    async def running(self, job_id: str, world: int, step: int = 5) -> dict[str, Any]:
        def ready(job: dict[str, Any]) -> bool:
            live = [w for w in job["workers"] if w["state"] == "RUNNING" and w["pid"]]
            return job["state"] == "RUNNING" and len(live) == world and job["step"] >= step

        return await self.until(job_id, ready)

    async def event(self, kind: str, timeout_s: float = 30.0, **match: Any) -> dict[str, Any]:
        async with asyncio.timeout(timeout_s):
            while True:
                event = await self.events.get()
                self.seen.append(event)
                if event.type == kind and all(event.data.get(k) == v for k, v in match.items()):
                    return event.data

    async def fault(self, job_id: str) -> dict[str, Any]:
        """The next failure that interrupts the job (advisory stragglers are passed over)."""
        while True:
            failure = await self.event("failure.detected", job_id=job_id)
            if failure["action"] != "report":
                return failure

    def failures(self, job_id: str, generation: int) -> list[dict[str, Any]]:
        while not self.events.empty():
            self.seen.append(self.events.get_nowait())
        return [
            e.data for e in self.seen
            if e.type == "failure.detected"
            and e.data["job_id"] == job_id and e.data["generation"] == generation
            and e.data["action"] != "report"
        ]  # fmt: skip


@pytest.fixture
async def watch(stack: Stack, nats_url: str) -> AsyncIterator[Watch]:
    bus = await Bus.connect(nats_url, source="unicron/test")
    events: asyncio.Queue[CloudEvent] = asyncio.Queue()
    await bus.consume("unicron.events.>", "test-watch", parse_event, events.put, deliver_new=True)
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as api:
        yield Watch(api, events)
    await bus.close()


def _pid(job: dict[str, Any], rank: int) -> int:
    return int(next(w["pid"] for w in job["workers"] if w["rank"] == rank))


async def _finish(watch: Watch, job_id: str, steps: int) -> dict[str, Any]:
    done = await watch.until(job_id, lambda j: j["state"] in {"SUCCEEDED", "FAILED"})
    assert done["state"] == "SUCCEEDED", done["history"]
    assert done["step"] == steps
    return done


async def test_killing_one_of_four_ranks_gives_exactly_one_failure(watch: Watch) -> None:
    job_id = (await watch.api.post("/v1/jobs", json=small_job("one-failure", steps=60))).json()[
        "id"
    ]
    job = await watch.running(job_id, world=4, step=10)
    os.kill(_pid(job, 2), signal.SIGKILL)
    failure = await watch.fault(job_id)
    assert (failure["kind"], failure["rank"], failure["severity"]) == ("crash", 2, "SEV2")
    await watch.running(job_id, world=4, step=job["step"] + 1)
    assert len(watch.failures(job_id, job["generation"])) == 1
    await _finish(watch, job_id, 60)


async def test_stopped_worker_is_a_hang_and_the_job_heals(watch: Watch) -> None:
    job_id = await watch.submit("hang", 60)
    job = await watch.running(job_id, world=4, step=10)
    os.kill(_pid(job, 1), signal.SIGSTOP)
    failure = await watch.fault(job_id)
    assert (failure["kind"], failure["rank"]) == ("hang", 1)
    assert failure["evidence"]["process_state"] == "T"
    await _finish(watch, job_id, 60)


async def test_injected_exception_is_classified_from_its_text(watch: Watch) -> None:
    job_id = await watch.submit("ecc", 60)
    await watch.running(job_id, world=4, step=10)
    body = {"rank": 3, "kind": "exception",
            "message": "CUDA error: uncorrectable ECC error encountered"}  # fmt: skip
    assert (await watch.api.post(f"/v1/jobs/{job_id}/faults", json=body)).status_code == 202
    failure = await watch.fault(job_id)
    assert (failure["kind"], failure["category"], failure["rank"]) == ("exception", "ecc", 3)
    assert (failure["severity"], failure["action"]) == ("SEV1", "reconfigure")
    await _finish(watch, job_id, 60)


@pytest.mark.extended  # the multi-host suite loses a real host too
async def test_lost_node_is_sev1_and_the_job_finishes_on_the_rest(
    watch: Watch, stack: Stack
) -> None:
    job_id = await watch.submit("node-loss", 60)
    await watch.running(job_id, world=4, step=10)
    agent = stack.children["agent-node-1"].process
    assert agent is not None
    agent.kill()  # the node's workers die with their agent
    lost = await watch.event("node.lost", timeout_s=10)
    assert lost["node_id"] == "node-1"
    failure = await watch.fault(job_id)
    assert (failure["kind"], failure["node_id"], failure["severity"]) == (
        "node_lost", "node-1", "SEV1",
    )  # fmt: skip
    shrunk = await watch.running(job_id, world=2, step=1)
    assert {w["node_id"] for w in shrunk["workers"]} == {"node-0"}
    await _finish(watch, job_id, 60)
