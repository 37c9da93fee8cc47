"""Job submission and control over REST, checked against what lands in Redis and on the bus."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import cast

import httpx
import pytest
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import JobState, NodeRecord
from unicron.shared.store.state import StateStore

from tests.api.factories import moved

SPEC = {"name": "tiny", "steps": 10, "min_workers": 1, "max_workers": 2}


async def stored_events(bus: Bus) -> list[CloudEvent]:
    """Every event on the stream right now, oldest first."""
    info = await bus.js.stream_info("UNICRON_EVENTS")
    events: list[CloudEvent] = []
    if info.state.messages == 0:
        return events
    tail = cast(AsyncGenerator[tuple[int, CloudEvent], None], bus.tail_events(after_seq=0))
    async with aclosing(tail):
        while len(events) < info.state.messages:
            _, event = await asyncio.wait_for(anext(tail), 5)
            events.append(event)
    return events


async def test_submit_stores_a_pending_job_and_announces_it(
    client: httpx.AsyncClient, bus: Bus, state: StateStore
) -> None:
    response = await client.post("/v1/jobs", json=SPEC)
    assert response.status_code == 201
    job = response.json()
    assert job["id"].startswith("job-") and len(job["id"]) == len("job-") + 12
    assert job["state"] == "PENDING"
    assert job["spec"]["model"]["n_layer"] == 4  # defaults filled in
    assert [(h["state"], h["reason"]) for h in job["history"]] == [("PENDING", "submitted")]

    stored = await state.get_job(job["id"])
    assert stored is not None and stored.state == JobState.PENDING and stored.spec.steps == 10
    [event] = await stored_events(bus)
    assert event.type == "job.submitted"
    assert event.subject == job["id"]
    assert event.data["spec"]["max_workers"] == 2

    assert (await client.get(f"/v1/jobs/{job['id']}")).json() == job
    listed = (await client.get("/v1/jobs")).json()
    assert [j["id"] for j in listed] == [job["id"]]
    assert (await client.get("/v1/jobs", params={"state": "RUNNING"})).json() == []


async def test_same_idempotency_key_returns_the_same_job_once(
    client: httpx.AsyncClient, bus: Bus, state: StateStore
) -> None:
    headers = {"Idempotency-Key": "deploy-42"}
    first = await client.post("/v1/jobs", json=SPEC, headers=headers)
    again = await client.post("/v1/jobs", json=SPEC, headers=headers)
    other = await client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "deploy-43"})

    assert first.status_code == again.status_code == other.status_code == 201
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"] != other.json()["id"]
    assert len(await state.list_jobs()) == 2
    reused = await client.post("/v1/jobs", json={**SPEC, "steps": 99}, headers=headers)
    assert reused.status_code == 422 and first.json()["id"] in reused.json()["detail"]
    assert len(await state.list_jobs()) == 2
    submitted = [e.subject for e in await stored_events(bus) if e.type == "job.submitted"]
    assert submitted == [first.json()["id"], other.json()["id"]]


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ('{"name": "tiny", "steps": ', "body", "JSON decode error"),
        (b'{"name": "\xff"}', "body", "JSON decode error: the body is not UTF-8"),
        ({"name": "tiny", "trainer": "bert"}, "trainer", "'gpt'"),
        ({"name": "tiny", "min_workers": 4, "max_workers": 2}, "body", "min_workers"),
        ({"name": "tiny", "steps": 0}, "steps", "greater than 0"),
        ({"name": "tiny", "colour": "red"}, "colour", "not permitted"),
        ({"steps": 5}, "name", "required"),
    ],
    ids=["malformed-json", "not-utf8", "unknown-trainer", "min-above-max", "zero-steps",
         "unknown-field", "no-name"],
)  # fmt: skip
async def test_invalid_submission_is_refused_naming_the_field(
    client: httpx.AsyncClient, state: StateStore, body: str | bytes | dict[str, object],
    field: str, words: str,
) -> None:  # fmt: skip
    if isinstance(body, str | bytes):
        response = await client.post(
            "/v1/jobs", content=body, headers={"Content-Type": "application/json"}
        )
    else:
        response = await client.post("/v1/jobs", json=body)
    assert response.status_code == 422
    payload = response.json()
    [error] = payload["detail"]
    assert error["loc"][0] == "body"
    assert field in [str(part) for part in error["loc"]]
    assert words in error["msg"]
    assert words in payload["message"]
    assert not error["msg"].startswith("Value error")
    assert await state.list_jobs() == []


async def test_unknown_job_is_404_with_a_message(client: httpx.AsyncClient) -> None:
    for response in (
        await client.get("/v1/jobs/job-000000000000"),
        await client.post("/v1/jobs/job-000000000000/cancel"),
    ):
        assert response.status_code == 404
        assert response.json()["detail"] == "job 'job-000000000000' not found"


async def test_cancel_ends_the_job_and_announces_it_once(
    client: httpx.AsyncClient, bus: Bus, state: StateStore
) -> None:
    job_id = (await client.post("/v1/jobs", json=SPEC)).json()["id"]
    await state.update_job(job_id, moved(JobState.STARTING, JobState.RUNNING))

    response = await client.post(f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 200
    assert response.json()["state"] == "CANCELLED"
    assert response.json()["history"][-1]["reason"] == "cancelled by user"
    repeated = await client.post(f"/v1/jobs/{job_id}/cancel")
    assert repeated.status_code == 200 and repeated.json()["history"] == response.json()["history"]

    stored = await state.get_job(job_id)
    assert stored is not None and stored.state == JobState.CANCELLED
    changes = [e for e in await stored_events(bus) if e.type == "job.state_changed"]
    assert len(changes) == 1
    assert changes[0].subject == job_id
    assert (changes[0].data["old"], changes[0].data["new"]) == ("RUNNING", "CANCELLED")
    assert changes[0].data["reason"] == "cancelled by user"


async def test_cancel_of_a_finished_job_is_a_conflict(
    client: httpx.AsyncClient, state: StateStore
) -> None:
    job_id = (await client.post("/v1/jobs", json=SPEC)).json()["id"]
    await state.update_job(job_id, moved(JobState.STARTING, JobState.SUCCEEDED))
    response = await client.post(f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 409
    assert "SUCCEEDED" in response.json()["detail"]
    stored = await state.get_job(job_id)
    assert stored is not None and stored.state == JobState.SUCCEEDED


async def test_nodes_lists_registered_nodes(client: httpx.AsyncClient, state: StateStore) -> None:
    assert (await client.get("/v1/nodes")).json() == []
    await state.put_node(NodeRecord(id="node-b", slots=2, used=1))
    await state.put_node(NodeRecord(id="node-a", slots=4))
    nodes = (await client.get("/v1/nodes")).json()
    assert [(n["id"], n["state"], n["slots"], n["used"]) for n in nodes] == [
        ("node-a", "READY", 4, 0),
        ("node-b", "READY", 2, 1),
    ]
    assert "last_heartbeat" in nodes[0]
