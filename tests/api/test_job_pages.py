"""``GET /v1/jobs`` a page at a time, and finished jobs that expire after their retention."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from unicron.services.api.paging import encode_cursor, page_jobs
from unicron.shared.contracts.models import Job, JobSpec, JobState
from unicron.shared.store.jobindex import JobPosition
from unicron.shared.store.state import StateStore

from tests.api.factories import TOKENS, USER_A, USER_B, bearer, moved, put_job
from tests.api.live import eventually, serve_api

SPEC = {"name": "p", "steps": 10}
RETENTION_S = 2.0  # long enough to list them first on a busy machine


async def submit(client: httpx.AsyncClient, n: int, **kwargs: Any) -> list[str]:
    ids = []
    for _ in range(n):
        response = await client.post("/v1/jobs", json=SPEC, **kwargs)
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    return ids


async def every_page(
    client: httpx.AsyncClient, params: dict[str, Any], **kwargs: Any
) -> AsyncIterator[list[str]]:
    """The ids of each page, following X-Next-Cursor to the last."""
    params = dict(params)
    while True:
        response = await client.get("/v1/jobs", params=params, **kwargs)
        assert response.status_code == 200, response.text
        yield [job["id"] for job in response.json()]
        if "X-Next-Cursor" not in response.headers:
            return
        params["cursor"] = response.headers["X-Next-Cursor"]


async def test_pages_hold_every_job_once_even_while_jobs_are_added(
    client: httpx.AsyncClient,
) -> None:
    submitted = await submit(client, 12)
    first = await client.get("/v1/jobs")
    assert [j["id"] for j in first.json()] == submitted and "X-Next-Cursor" not in first.headers

    seen: list[str] = []
    params: dict[str, Any] = {"limit": 5}
    while True:
        page = await client.get("/v1/jobs", params=params)
        assert len(page.json()) <= 5
        seen += [job["id"] for job in page.json()]
        if "X-Next-Cursor" not in page.headers:
            break
        params["cursor"] = page.headers["X-Next-Cursor"]
        # Added between pages, and concurrently with each other: still seen, once each.
        if len(submitted) < 30:
            more = await asyncio.gather(*(submit(client, 1) for _ in range(3)))
            submitted += [job_id for [job_id] in more]
    assert sorted(seen) == sorted(submitted) and len(seen) == len(set(seen))


async def test_a_user_pages_only_over_its_tenants_jobs_and_filters_by_state(
    nats_url: str, redis_url: str
) -> None:
    with serve_api(nats_url, redis_url, api_tokens=TOKENS) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
            mine, theirs = [], []
            for _ in range(4):
                mine += await submit(client, 1, headers=bearer(USER_A))
                theirs += await submit(client, 2, headers=bearer(USER_B))
            cancelled = await client.post(f"/v1/jobs/{mine[1]}/cancel", headers=bearer(USER_A))
            assert cancelled.status_code == 200

            pages = every_page(client, {"limit": 1}, headers=bearer(USER_A))
            assert [job_id async for page in pages for job_id in page] == mine
            # Another tenant's cursor shows its holder's jobs only, from that position on.
            b_page = await client.get("/v1/jobs", params={"limit": 2}, headers=bearer(USER_B))
            cursor = b_page.headers["X-Next-Cursor"]
            after_b = await client.get(
                "/v1/jobs", params={"cursor": cursor}, headers=bearer(USER_A)
            )
            assert [j["id"] for j in after_b.json()] == mine[1:]

            states = {"state": ["CANCELLED", "RUNNING"]}
            filtered = await client.get("/v1/jobs", params=states, headers=bearer(USER_A))
            assert [j["id"] for j in filtered.json()] == [mine[1]]
            pending = await client.get(
                "/v1/jobs", params={"state": "PENDING"}, headers=bearer(USER_B)
            )
            assert [j["id"] for j in pending.json()] == theirs


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"limit": 0}, "limit: Input should be greater than or equal to 1"),
        ({"limit": 501}, "limit: Input should be less than or equal to 500"),
        ({"limit": "all"}, "limit: Input should be a valid integer"),
        ({"cursor": "garbage!"}, "cursor: not a cursor this API gave out"),
        ({"cursor": encode_cursor(JobPosition(1.0, "job-x"))[:-3]}, "cursor: not a cursor"),
        ({"cursor": "WzEsMl0"}, "cursor: not a cursor this API gave out (it names no job)"),
        ({"cursor": "x" * 513}, "cursor: String should have at most 512 characters"),
        ({"state": "DONE"}, "state.0: Input should be 'PENDING'"),
    ],
    ids=["zero", "above-500", "not-a-number", "garbage", "cut-short", "no-job", "too-long",
         "unknown-state"],
)  # fmt: skip
async def test_bad_paging_parameters_are_refused_saying_why(
    client: httpx.AsyncClient, params: dict[str, Any], words: str
) -> None:
    response = await client.get("/v1/jobs", params=params)
    assert response.status_code == 422
    assert words in response.json()["message"]


@pytest.fixture
def short_retention_url(nats_url: str, redis_url: str) -> Iterator[str]:
    with serve_api(nats_url, redis_url, job_retention_s=RETENTION_S) as url:
        yield url


async def test_a_finished_job_expires_after_its_retention_and_a_running_one_stays(
    short_retention_url: str, redis_url: str, state: StateStore
) -> None:
    writer = await StateStore.connect(redis_url, job_retention_s=RETENTION_S)  # as the executor
    async with httpx.AsyncClient(base_url=short_retention_url, timeout=10.0) as client:
        [pending, cancelled] = await submit(client, 2)
        running = (await put_job(writer, "job-running")).id
        succeeded = (await put_job(writer, "job-succeeded")).id
        assert (await client.post(f"/v1/jobs/{cancelled}/cancel")).status_code == 200
        await writer.update_job(succeeded, moved(JobState.SUCCEEDED))
        listed = [j["id"] for j in (await client.get("/v1/jobs")).json()]
        assert listed == [pending, cancelled, running, succeeded]

        async def expired() -> bool:
            answers = [await client.get(f"/v1/jobs/{i}") for i in (cancelled, succeeded)]
            return all(answer.status_code == 404 for answer in answers)

        await eventually(expired, timeout_s=10)
        listed = [j["id"] for j in (await client.get("/v1/jobs")).json()]
        assert listed == [pending, running]
        for job_id in (pending, running):
            for kind in ("job", "job-summary"):
                assert await state.redis.ttl(state._key(kind, job_id)) == -1  # never expires
        for job_id in (cancelled, succeeded):
            assert not await state.redis.exists(state._key("job-summary", job_id))
        assert await state.redis.zcard(state._key("jobs")) == 2  # the listing unindexed them
    await writer.close()


async def test_a_finished_job_whose_expiry_was_never_set_is_dropped_by_the_listing(
    short_retention_url: str, state: StateStore
) -> None:
    """A writer that died between writing the record and setting its expiry."""
    ended = Job(id="job-old", name="old", spec=JobSpec(name="old"))
    moved(JobState.STARTING, JobState.FAILED, reason="gave up")(ended)
    ended.history[-1].at = time.time() - 2 * RETENTION_S
    await state.create_job(ended)  # this store's retention is the default week
    assert await state.redis.ttl(state._key("job", ended.id)) > 0
    await state.redis.persist(state._key("job", ended.id))
    async with httpx.AsyncClient(base_url=short_retention_url, timeout=10.0) as client:
        assert (await client.get("/v1/jobs")).json() == []
    assert await state.get_job(ended.id) is None
    assert await state.redis.zcard(state._key("jobs")) == 0


async def test_a_page_that_reads_its_scan_limit_ends_early_with_a_cursor(
    state: StateStore,
) -> None:
    """Among many jobs a caller may not see, a page stops reading and says where to go on;
    entries with equal scores (an index restored from elsewhere) are each read once."""
    jobs = [Job(id=f"job-{i:03d}", name="j", spec=JobSpec(name="j")) for i in range(30)]
    for job in jobs:
        await state.create_job(job)
    await state.redis.zadd(state._key("jobs"), {job.id: 5.0 for job in jobs[:25]})
    wanted = {jobs[3].id, jobs[24].id, jobs[29].id}

    pages, after = [], None
    while True:
        page = await page_jobs(state, after, 2, lambda j: j.id in wanted, scan_limit=4)
        pages.append([job.id for job in page.jobs])
        if page.next_after is None:
            break
        after = page.next_after
    assert [job_id for page in pages for job_id in page] == sorted(wanted)
    assert len(pages) > 3 and [] in pages  # stopped early at least once, with nothing found


async def test_a_job_stored_late_is_indexed_after_every_job_already_listed(
    state: StateStore,
) -> None:
    """Two submissions in flight at once: the one created first may be stored second. A client
    that already paged past the other must still find it on its next page."""
    later = Job(id="job-later", name="l", spec=JobSpec(name="l"), submitted_at=2_000_000_000.5)
    earlier = Job(id="job-earlier", name="e", spec=JobSpec(name="e"), submitted_at=1_900_000_000.0)
    await state.create_job(later)
    [first] = (await page_jobs(state, None, 10, lambda _: True)).jobs
    assert first.id == later.id  # a client's cursor now points after it
    await state.create_job(earlier)
    [position] = await state.index_after(None, 0, 1)
    next_page = await page_jobs(state, position, 10, lambda _: True)
    assert [job.id for job in next_page.jobs] == [earlier.id]
