"""The event stream over SSE: wire format, live delivery, keep-alive and replay."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import JobSubmitted, NodeJoined
from unicron.shared.contracts.models import JobSpec


def submitted(job_id: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name="e", spec=JobSpec(name="e"))


async def sse_blocks(response: httpx.Response) -> AsyncIterator[list[str]]:
    """Each SSE message (or ping comment) as its list of raw lines."""
    block: list[str] = []
    async for line in response.aiter_lines():
        if line:
            block.append(line)
        elif block:
            yield block
            block = []


def fields(block: list[str]) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in block if not line.startswith(":"))


async def test_follow_replays_then_streams_live_events_with_pings(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    await bus.publish_event(submitted("job-1"))
    await bus.publish_event(submitted("job-2"))
    async with asyncio.timeout(10), client.stream("GET", "/v1/events?since=1") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        blocks = sse_blocks(response)
        first = fields(await anext(blocks))
        assert (first["id"], first["event"]) == ("2", "job.submitted")
        assert json.loads(first["data"])["subject"] == "job-2"

        await bus.publish_event(NodeJoined(node_id="node-a", slots=2, host="h", boot_id="b1"))
        live = fields(await anext(blocks))
        assert (live["id"], live["event"]) == ("3", "node.joined")
        cloud_event = json.loads(live["data"])
        assert cloud_event["specversion"] == "1.0" and cloud_event["data"]["slots"] == 2

        # Keep-alive: with nothing to send, the server still writes a comment now and then.
        ping = await anext(blocks)
        assert ping[0].startswith(":")


async def test_history_replays_from_since_or_last_event_id_and_ends(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    for n in range(1, 5):
        await bus.publish_event(submitted(f"job-{n}"))

    async def history(**kwargs: object) -> list[str]:
        async with client.stream("GET", "/v1/events", **kwargs) as response:  # type: ignore[arg-type]
            return [fields(b)["id"] async for b in sse_blocks(response) if fields(b)]

    async with asyncio.timeout(10):
        assert await history(params={"follow": "false"}) == ["1", "2", "3", "4"]
        assert await history(params={"follow": "false", "since": 0}) == ["1", "2", "3", "4"]
        assert await history(params={"follow": "false", "since": 2}) == ["3", "4"]
        assert await history(params={"follow": "false", "since": 4}) == []
        resumed = await history(params={"follow": "false"}, headers={"Last-Event-ID": "3"})
        assert resumed == ["4"]

    bad = await client.get("/v1/events", headers={"Last-Event-ID": "soon"})
    assert bad.status_code == 400 and "Last-Event-ID" in bad.json()["detail"]
    assert (await client.get("/v1/events", params={"since": -1})).status_code == 422


async def test_history_ends_even_when_the_last_message_is_malformed(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    await bus.publish_event(submitted("job-1"))
    await bus.js.publish("unicron.events.job.submitted", b"{not json")
    async with asyncio.timeout(10):
        response = await client.get("/v1/events", params={"follow": "false"})
    assert response.status_code == 200
    assert "id: 1" in response.text and "id: 2" not in response.text
