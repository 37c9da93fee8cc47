"""The event stream filtered by type and job (``GET /v1/events?type=..&type=..&job=..``), and
what a user may ask of it."""

from __future__ import annotations

import asyncio

import httpx
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import NodeJoined
from unicron.shared.store.state import StateStore

from tests.api.factories import ADMIN, USER_A, bearer, put_job
from tests.api.test_events import fields, sse_blocks, submitted
from tests.api.test_webhooks import failure
from tests.cli.test_cli import unicron


async def history(client: httpx.AsyncClient, **params: object) -> list[tuple[str, str]]:
    """(id, type) of every stored event the query keeps."""
    query = {"follow": "false", **params}
    async with asyncio.timeout(10), client.stream("GET", "/v1/events", params=query) as response:
        assert response.status_code == 200, await response.aread()
        return [(f["id"], f["event"]) async for b in sse_blocks(response) if (f := fields(b))]


async def test_type_and_job_keep_only_those_events(client: httpx.AsyncClient, bus: Bus) -> None:
    await bus.publish_event(submitted("job-1"))  # 1
    await bus.publish_event(submitted("job-2"))  # 2
    await bus.publish_event(failure("job-1"))  # 3
    await bus.publish_event(NodeJoined(node_id="node-a", slots=2, host="h", boot_id="b"))  # 4
    await bus.publish_event(failure("job-2"))  # 5

    assert await history(client, type="failure.detected") == [
        ("3", "failure.detected"), ("5", "failure.detected"),
    ]  # fmt: skip
    assert await history(client, job="job-1") == [("1", "job.submitted"), ("3", "failure.detected")]
    both = await history(client, type=["node.joined", "failure.detected"], job="job-2")
    assert both == [("5", "failure.detected")]
    assert [i for i, _ in await history(client, type=["node.joined", "job.submitted"])] == [
        "1", "2", "4",
    ]  # fmt: skip

    # A followed stream is filtered the same way as it goes.
    query = {"type": "failure.detected", "job": "job-2", "since": 5}
    async with asyncio.timeout(10), client.stream("GET", "/v1/events", params=query) as response:
        blocks = (fields(b) async for b in sse_blocks(response) if not b[0].startswith(":"))
        await bus.publish_event(failure("job-1", tag="-again"))  # 6: another job's
        await bus.publish_event(submitted("job-3"))  # 7: another type
        await bus.publish_event(failure("job-2", tag="-again"))  # 8
        live = await anext(blocks)
        assert (live["id"], live["event"]) == ("8", "failure.detected")


async def test_a_bad_filter_is_refused_with_the_reason(
    secured: httpx.AsyncClient, state: StateStore
) -> None:
    await put_job(state, "job-a")  # no tenant: an admin's alone
    unknown = await secured.get(
        "/v1/events", params={"type": ["failure.detected", "job.exploded"]}, headers=bearer(ADMIN)
    )
    assert unknown.status_code == 422
    message = unknown.json()["message"]
    assert "type" in message and "job.exploded" in message and "node.lost" in message
    user = bearer(USER_A)
    plans = await secured.get("/v1/events", params={"type": "plan.created"}, headers=user)
    assert plans.status_code == 403
    other = await secured.get("/v1/events", params={"job": "job-a"}, headers=user)
    assert other.status_code == 404 and "job-a" in other.json()["detail"]
    admin = await secured.get(
        "/v1/events", params={"job": "job-a", "follow": "false"}, headers=bearer(ADMIN)
    )
    assert admin.status_code == 200


async def test_the_cli_passes_type_and_job(api_url: str, bus: Bus) -> None:
    await bus.publish_event(submitted("job-1"))
    await bus.publish_event(submitted("job-2"))
    await bus.publish_event(failure("job-1"))
    await bus.publish_event(NodeJoined(node_id="node-a", slots=2, host="h", boot_id="b"))
    args = ["events", "--type", "failure.detected", "--type", "job.submitted", "--job", "job-1"]
    result = await unicron(*args, api_url=api_url)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and "job.submitted" in lines[0] and "failure.detected" in lines[1]
    assert all("job-1" in line for line in lines)
    refused = await unicron("events", "--type", "job.exploded", api_url=api_url)
    assert refused.exit_code == 2 and "job.exploded" in refused.output
