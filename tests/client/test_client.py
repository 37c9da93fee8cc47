"""``unicron.Client`` and ``unicron.AsyncClient`` against a real API over real NATS and Redis:
typed answers, errors that say what the API said, ``wait`` on the event stream, and an event
stream that resumes where a dropped connection broke it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import NodeJoined
from unicron.shared.procs import free_port
from unicron.shared.store.state import StateStore

from tests.api.factories import ADMIN, USER_A, moved, put_job
from tests.api.log_nodes import JOB, serve_nodes
from tests.client.moves import move
from tests.client.proxy import proxy_to
from unicron import (
    ApiUnreachable,
    AsyncClient,
    Client,
    Conflict,
    Forbidden,
    InvalidRequest,
    JobSpec,
    JobState,
    NotFound,
    Unauthorized,
    WaitTimedOut,
)


def test_the_sync_client_submits_lists_cancels_and_waits(api_url: str) -> None:
    with Client(api_url) as client:
        first = client.submit(JobSpec(name="first", steps=10))
        assert (first.name, first.spec.steps, first.state) == ("first", 10, JobState.PENDING)
        keyed = client.submission({"name": "keyed"}, idempotency_key="k1")
        again = client.submission({"name": "keyed"}, idempotency_key="k1")
        assert not keyed.replayed and again.replayed and again.job.id == keyed.job.id
        assert client.get(first.id).history[0].reason == "submitted"
        assert [j.id for j in client.list()] == [first.id, keyed.job.id]
        assert [[j.id for j in page] for page in client.pages(page_limit=1)] == [
            [first.id], [keyed.job.id],
        ]  # fmt: skip

        assert client.cancel(first.id).state == JobState.CANCELLED
        assert [j.id for j in client.list(states=[JobState.CANCELLED])] == [first.id]
        # Already there: the read on connecting answers, no event needed.
        assert client.wait(first.id, timeout_s=10).state == JobState.CANCELLED
        with pytest.raises(WaitTimedOut, match=f"job {keyed.job.id} did not reach RUNNING"):
            client.wait(keyed.job.id, states=[JobState.RUNNING], timeout_s=0.5)


async def test_wait_returns_once_the_event_stream_says_the_job_got_there(
    api_url: str, state: StateStore, bus: Bus
) -> None:
    async with AsyncClient(api_url) as client:
        job = await client.submit({"name": "waited", "steps": 5})
        running = asyncio.create_task(client.wait(job.id, states=[JobState.RUNNING]))
        ended = asyncio.create_task(client.wait(job.id, timeout_s=20))
        await move(state, bus, job.id, JobState.STARTING)
        await move(state, bus, job.id, JobState.RUNNING)
        assert (await asyncio.wait_for(running, 10)).state == JobState.RUNNING
        assert not ended.done()
        await move(state, bus, job.id, JobState.SUCCEEDED)
        assert (await asyncio.wait_for(ended, 10)).state == JobState.SUCCEEDED
        # A job that ends elsewhere ends the wait too, instead of hanging until the timeout.
        other = await client.submit({"name": "other"})
        waiting = asyncio.create_task(client.wait(other.id, states=[JobState.RUNNING]))
        await client.cancel(other.id)
        assert (await asyncio.wait_for(waiting, 10)).state == JobState.CANCELLED


async def test_errors_carry_the_status_and_the_apis_reason(
    api_url: str, secured_url: str, state: StateStore
) -> None:
    async with AsyncClient(api_url) as client:
        with pytest.raises(NotFound, match="job 'job-nope' not found") as missing:
            await client.get("job-nope")
        assert missing.value.status_code == 404
        with pytest.raises(InvalidRequest, match="steps: Input should be greater than 0"):
            await client.submit({"name": "bad", "steps": 0})
        with pytest.raises(NotFound):
            await client.wait("job-nope", timeout_s=5)
        done = await client.submit({"name": "done"})
        await state.update_job(done.id, moved(JobState.STARTING, JobState.SUCCEEDED))
        with pytest.raises(Conflict, match="already ended as SUCCEEDED"):
            await client.cancel(done.id)
    async with AsyncClient(secured_url) as anonymous:
        with pytest.raises(Unauthorized, match="needs a bearer token"):
            await anonymous.list()
    async with AsyncClient(secured_url, token="not-a-token-of-this-api") as stranger:
        with pytest.raises(Unauthorized, match="not valid"):
            await stranger.nodes()
    await put_job(state, "job-run")
    async with AsyncClient(secured_url, token=USER_A) as user:
        with pytest.raises(Forbidden, match="needs an admin token"):
            await user.inject_fault("job-run", {"rank": 0, "kind": "exception"})
    async with AsyncClient(secured_url, token=ADMIN) as admin:
        assert [n.id for n in await admin.nodes()] == []
    nowhere = f"http://127.0.0.1:{free_port()}"
    with (
        Client(nowhere) as client,
        pytest.raises(ApiUnreachable, match=f"cannot reach .*{nowhere}"),
    ):
        client.get("job-x")


async def test_the_event_stream_resumes_after_a_dropped_connection(api_url: str, bus: Bus) -> None:
    def joined(n: int) -> NodeJoined:
        return NodeJoined(node_id=f"node-{n}", slots=8, host="h", boot_id=f"b{n}")

    async with proxy_to(api_url) as (url, proxy), AsyncClient(url) as client:
        stream = client.sequenced_events(since=0)
        for n in (1, 2):
            await bus.publish_event(joined(n))
        seen = [await asyncio.wait_for(anext(stream), 10) for _ in range(2)]
        proxy.cut()  # published while the connection is down: delivered after the resume
        for n in (3, 4):
            await bus.publish_event(joined(n))
        seen += [await asyncio.wait_for(anext(stream), 10) for _ in range(2)]
        await stream.aclose()
    assert [(seq, e.subject) for seq, e in seen] == [(n, f"node-{n}") for n in (1, 2, 3, 4)]
    assert proxy.connections == 2


async def test_history_and_logs_from_the_sync_client(
    api_url: str, tmp_path: Path, bus: Bus, state: StateStore
) -> None:
    nodes = await serve_nodes(tmp_path, bus, state)
    await put_job(state, JOB, nodes=("node-a", "node-b"), generation=2)
    nodes["node-b"].write(2, 1, *(f"line {i}" for i in range(4)), running=False)
    await bus.publish_event(NodeJoined(node_id="node-a", slots=2, host="h", boot_id="b"))

    def read() -> tuple[str, list[str]]:
        # Blocking calls in a thread: the log servers answer on this test's event loop.
        with Client(api_url) as client:
            text = "".join(client.logs(JOB, rank=1, tail=2))
            return text, [e.type for e in client.events(since=0, follow=False)]

    text, history = await asyncio.wait_for(asyncio.to_thread(read), 20)
    assert text == "line 2\nline 3\n"
    assert history == ["node.joined"]


async def test_events_of_some_types_about_one_job(api_url: str, bus: Bus) -> None:
    async with AsyncClient(api_url) as client:
        mine, other = [await client.submit({"name": name}) for name in ("mine", "other")]
        for job in (mine, other):
            await client.cancel(job.id)
        await bus.publish_event(NodeJoined(node_id="node-a", slots=2, host="h", boot_id="b"))
        history = client.events(["job.state_changed"], job=mine.id, since=0, follow=False)
        assert [(e.type, e.subject) async for e in history] == [("job.state_changed", mine.id)]
        with pytest.raises(InvalidRequest, match="type"):
            [e async for e in client.events(["job.no_such_type"], follow=False)]
