"""``GET /v1/jobs/{id}/logs`` against agents' log servers on the real bus: the text of a rank
comes from the node that ran it, in its generation, while it runs and after; ``follow``
streams what is written later; unknown jobs, ranks and silent nodes get a 4xx/5xx that says
why."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.models import Job, JobState
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.store.state import StateStore

from tests.api.factories import USER_A, USER_B, bearer, put_job
from tests.api.log_nodes import JOB, Node, serve_nodes

LINES = [f"step {i} loss {1 / (i + 1):.3f}" for i in range(150)]


@pytest.fixture
async def nodes(tmp_path: Path, bus: Bus, state: StateStore) -> dict[str, Node]:
    return await serve_nodes(tmp_path, bus, state)


async def text(client: httpx.AsyncClient, **params: str | int) -> str:
    response = await client.get(f"/v1/jobs/{JOB}/logs", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


async def test_rank_1_is_read_from_its_node_while_running_and_after(
    client: httpx.AsyncClient, state: StateStore, nodes: dict[str, Node]
) -> None:
    await put_job(state, JOB, nodes=("node-a", "node-b"), generation=3)
    nodes["node-b"].write(3, 1, *LINES)
    nodes["node-a"].write(3, 0, "rank zero says hi")
    nodes["node-a"].write(2, 1, "rank 1 of generation 2 ran on node-a", running=False)

    assert await text(client, rank=1) == "".join(f"{line}\n" for line in LINES[-100:])
    assert await text(client, rank=1, tail=2) == f"{LINES[-2]}\n{LINES[-1]}\n"
    assert await text(client, rank=1, tail=10_000) == "".join(f"{line}\n" for line in LINES)
    assert await text(client) == "rank zero says hi\n"
    # an older generation ran elsewhere: the node is found by asking the agents
    assert await text(client, rank=1, generation=2) == "rank 1 of generation 2 ran on node-a\n"

    nodes["node-b"].write(3, 1, "done", running=False)
    await state.update_job(
        JOB, lambda job: job.set_state(JobState.SUCCEEDED, "finished", by=ServiceRole.EXECUTOR)
    )
    assert await text(client, rank=1, tail=1) == "done\n"
    follow_of_a_finished_rank = await text(client, rank=1, tail=2, follow="true")
    assert follow_of_a_finished_rank == f"{LINES[-1]}\ndone\n"


async def test_a_log_longer_than_one_reply_arrives_whole(
    client: httpx.AsyncClient, state: StateStore, nodes: dict[str, Node]
) -> None:
    await put_job(state, JOB, nodes=("node-a",), generation=1)
    lines = [f"{i:05d} " + "é" * 60 for i in range(10_000)]  # ~1.2 MB: five agent replies
    nodes["node-a"].write(1, 0, *lines, running=False)
    assert await text(client, tail=10_000) == "".join(f"{line}\n" for line in lines)


async def test_follow_streams_lines_written_after_the_request(
    client: httpx.AsyncClient, state: StateStore, nodes: dict[str, Node]
) -> None:
    await put_job(state, JOB, nodes=("node-a", "node-b"), generation=3)
    node = nodes["node-b"]
    node.write(3, 1, "before the request")
    params: dict[str, str | int] = {"rank": 1, "follow": "true"}
    async with asyncio.timeout(20):
        async with client.stream("GET", f"/v1/jobs/{JOB}/logs", params=params) as response:
            assert response.status_code == 200
            received = ""
            chunks = response.aiter_text()
            while "before the request\n" not in received:
                received += await anext(chunks)
            node.write(3, 1, "written later", "and more")
            while "and more\n" not in received:
                received += await anext(chunks)
            node.write(3, 1, "last words", running=False)  # the worker exits: the stream ends
            async for chunk in chunks:
                received += chunk
    assert received == "before the request\nwritten later\nand more\nlast words\n"


async def test_bad_requests_say_why(
    client: httpx.AsyncClient, state: StateStore, nodes: dict[str, Node]
) -> None:
    await put_job(state, JOB, nodes=("node-a", "node-c"), generation=3)
    nodes["node-a"].write(3, 0, "hello")
    cases: list[tuple[str, dict[str, str | int], int, str]] = [
        ("job-nope", {}, 404, "job 'job-nope' not found"),
        (JOB, {"rank": 5}, 404, "rank 5 of generation 3 never ran for job job-logs"),
        (JOB, {"generation": 9}, 404, "no such generation"),
        # node-c may have run generation 1: not a 404 while its agent is silent
        (JOB, {"generation": 1}, 503, "the agents of nodes node-c are not answering"),
        (JOB, {"rank": 1}, 503, "the agent of node node-c is not answering"),
        (JOB, {"rank": -1}, 422, "rank: Input should be greater than or equal to 0"),
        (JOB, {"generation": -1}, 422, "generation: Input should be greater than or equal"),
        (JOB, {"tail": 10_001}, 422, "tail: Input should be less than or equal to 10000"),
        (JOB, {"tail": "lots"}, 422, "tail: Input should be a valid integer"),
        (JOB, {"follow": "maybe"}, 422, "follow: Input should be a valid boolean"),
    ]
    for job_id, params, code, words in cases:
        response = await client.get(f"/v1/jobs/{job_id}/logs", params=params)
        assert response.status_code == code, (params, response.text)
        body = response.json()
        assert words in (body.get("message") or body["detail"]), (params, body)


def of_team_a(job: Job) -> bool:
    job.tenant = "team-a"
    return True


async def test_another_tenants_logs_are_not_found(
    secured: httpx.AsyncClient, state: StateStore, nodes: dict[str, Node]
) -> None:
    job = await put_job(state, JOB, nodes=("node-a",), generation=1)
    await state.update_job(JOB, of_team_a)
    nodes["node-a"].write(1, 0, "team-a only")
    mine = await secured.get(f"/v1/jobs/{job.id}/logs", headers=bearer(USER_A))
    assert (mine.status_code, mine.text) == (200, "team-a only\n")
    theirs = await secured.get(f"/v1/jobs/{job.id}/logs", headers=bearer(USER_B))
    assert theirs.status_code == 404 and "not found" in theirs.json()["detail"]
