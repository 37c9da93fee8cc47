"""``GET /v1/jobs`` lists summaries: a page costs the same for a job of 2 ranks and one of
4,096, the summary follows every write of the record, and a record from before summaries is
listed all the same."""

from __future__ import annotations

import time

import httpx
from unicron.shared.contracts.models import Job, JobState
from unicron.shared.store.state import StateStore

from tests.api.factories import moved, put_job
from tests.twins.memorystore import MemoryStore

BIG = tuple(f"node-{i:04d}" for i in range(4096))


async def test_a_listing_holds_summaries_and_the_job_itself_its_workers(
    client: httpx.AsyncClient, state: StateStore
) -> None:
    await put_job(state, "job-big", nodes=BIG)
    await put_job(state, "job-small")
    listed = await client.get("/v1/jobs")
    assert [j["id"] for j in listed.json()] == ["job-big", "job-small"]
    big = listed.json()[0]
    assert "workers" not in big and "history" not in big
    assert big["world_size"] == 4096 and big["state"] == "RUNNING"
    assert len(listed.content) < 4096  # both jobs, not 4,098 workers
    detail = (await client.get("/v1/jobs/job-big")).json()
    assert len(detail["workers"]) == 4096


async def test_the_summary_follows_each_change_of_the_record(
    client: httpx.AsyncClient, state: StateStore
) -> None:
    await put_job(state, "job-a", job_state=JobState.PENDING)
    before = time.time()
    await state.update_job("job-a", moved(JobState.STARTING, reason="placed on 2 nodes"))
    [summary] = (await client.get("/v1/jobs")).json()
    assert (summary["state"], summary["reason"]) == ("STARTING", "placed on 2 nodes")
    assert summary["state_since"] >= before

    def stepped(job: Job) -> bool:
        job.step = 42
        return True

    await state.update_job("job-a", stepped)
    [summary] = (await client.get("/v1/jobs", params={"state": "STARTING"})).json()
    assert summary["step"] == 42 and summary["reason"] == "placed on 2 nodes"


async def test_a_record_without_a_summary_is_listed_and_given_one(
    client: httpx.AsyncClient, state: StateStore
) -> None:
    """A record written before summaries existed (or restored by hand) is not lost from the
    listing: the first listing that meets it stores its summary."""
    job = await put_job(state, "job-old")
    await state.redis.delete(state._key("job-summary", job.id))
    [listed] = (await client.get("/v1/jobs")).json()
    assert listed["id"] == job.id and listed["world_size"] == 2
    stored = await state.redis.get(state._key("job-summary", job.id))
    assert stored is not None and '"world_size":2' in stored


async def test_the_memory_twin_lists_the_same_summaries() -> None:
    store = MemoryStore()
    job = await put_job(store, "job-m")  # type: ignore[arg-type]  # a JobStore as Redis's is
    positions = await store.index_after(None, 0, 10)
    [(_, summary)] = await store.read_indexed(positions)
    assert summary == job.summary()
    store.keys.delete(store._key("job-summary", job.id))
    [(_, again)] = await store.read_indexed(positions)
    assert again == summary and store.keys.get(store._key("job-summary", job.id)) is not None
