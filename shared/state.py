"""Cluster state in Redis: jobs, nodes, plans and idempotency guards.

Records are JSON documents of the models in :mod:`shared.models` and :mod:`shared.plans`. Any
service may change a record, always through an optimistic transaction (WATCH/MULTI) that
re-reads and re-applies its change on conflict, so concurrent writers never lose each other's
updates. A record that no longer parses (a hand edit, a half-migrated field) is skipped by
the listings and logged once per record and process, so it never hides the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import redis.asyncio as aioredis
from pydantic import BaseModel, ValidationError
from redis.exceptions import WatchError
from tenacity import retry, stop_after_delay, wait_exponential

from unicron.shared.logging import get_logger
from unicron.shared.models import Job, NodeRecord
from unicron.shared.plans import Plan

M = TypeVar("M", bound=BaseModel)
Mutation = Callable[[M], bool | None]
# Records already reported as unreadable: a listing runs every few seconds; one line is enough.
_unreadable: set[tuple[str, str]] = set()


def parse_each(
    model: type[M], kind: str, ids: list[str], raws: list[str | bytes | None]
) -> list[M]:
    """The records that parse; each one that does not is logged once and left out."""
    records = []
    for record_id, raw in zip(ids, raws, strict=True):
        if raw is None:
            continue
        try:
            records.append(model.model_validate_json(raw))
        except ValidationError as exc:
            if (kind, record_id) not in _unreadable:
                _unreadable.add((kind, record_id))
                get_logger(**{f"{kind}_id": record_id}).error(
                    "unreadable record skipped", kind=kind, errors=exc.error_count()
                )
    return records


class StateStore:
    def __init__(self, client: aioredis.Redis, prefix: str = "unicron:") -> None:
        self.redis = client
        self.prefix = prefix

    @classmethod
    async def connect(cls, url: str, connect_timeout_s: float = 30.0) -> StateStore:
        client = aioredis.Redis.from_url(url, decode_responses=True, health_check_interval=10)

        @retry(stop=stop_after_delay(connect_timeout_s), wait=wait_exponential(0.1, max=2.0))
        async def _ping() -> None:
            await client.ping()

        await _ping()
        return cls(client)

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    async def _get(self, key: str, model: type[M]) -> M | None:
        raw = await self.redis.get(key)
        return None if raw is None else model.model_validate_json(raw)

    async def _update(self, key: str, model: type[M], mutate: Mutation[M]) -> M | None:
        """Apply ``mutate`` atomically; it returns False to leave the record unwritten."""
        task = asyncio.current_task()
        cancels = task.cancelling() if task else 0
        result = await self._update_watched(key, model, mutate)
        # redis-py's pipeline cleanup can swallow a cancel that lands during its UNWATCH; a
        # task cancelled meanwhile must still stop, or its shutdown waits on it forever.
        if task is not None and task.cancelling() > cancels:
            raise asyncio.CancelledError
        return result

    async def _update_watched(self, key: str, model: type[M], mutate: Mutation[M]) -> M | None:
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is None:
                        await pipe.reset()  # type: ignore[no-untyped-call]
                        return None
                    record = model.model_validate_json(raw)
                    if mutate(record) is False:
                        await pipe.reset()  # type: ignore[no-untyped-call]
                        return record
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, record.model_dump_json())
                    await pipe.execute()
                    return record
                except WatchError:
                    continue

    async def once(self, key: str, ttl_s: int = 7 * 24 * 3600) -> bool:
        """True the first time ``key`` is seen: the Redis side of at-least-once de-duplication."""
        return bool(await self.redis.set(self._key("once", key), "1", nx=True, ex=ttl_s))

    # --- jobs ------------------------------------------------------------------------------

    async def create_job(self, job: Job, idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Store a new job; with a key already used, return the job it created instead."""
        if idempotency_key is not None:
            idem = self._key("idem", idempotency_key)
            claimed = await self.redis.set(idem, job.id, nx=True, ex=7 * 24 * 3600)
            if not claimed:
                existing_id = str(await self.redis.get(idem) or "")
                existing = await self.get_job(existing_id)
                if existing is not None:
                    return existing, False
                await self.redis.set(idem, job.id, ex=7 * 24 * 3600)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._key("job", job.id), job.model_dump_json())
            pipe.zadd(self._key("jobs"), {job.id: job.submitted_at})
            await pipe.execute()
        return job, True

    async def get_job(self, job_id: str) -> Job | None:
        return await self._get(self._key("job", job_id), Job)

    async def list_jobs(self) -> list[Job]:
        ids = [str(i) for i in await self.redis.zrange(self._key("jobs"), 0, -1)]
        if not ids:
            return []
        raws = await self.redis.mget([self._key("job", i) for i in ids])
        return parse_each(Job, "job", ids, raws)

    async def update_job(self, job_id: str, mutate: Mutation[Job]) -> Job | None:
        return await self._update(self._key("job", job_id), Job, mutate)

    # --- nodes -----------------------------------------------------------------------------

    async def put_node(self, node: NodeRecord) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._key("node", node.id), node.model_dump_json())
            pipe.sadd(self._key("nodes"), node.id)
            await pipe.execute()

    async def get_node(self, node_id: str) -> NodeRecord | None:
        return await self._get(self._key("node", node_id), NodeRecord)

    async def list_nodes(self) -> list[NodeRecord]:
        ids = sorted(str(i) for i in await self.redis.smembers(self._key("nodes")))
        if not ids:
            return []
        raws = await self.redis.mget([self._key("node", i) for i in ids])
        return parse_each(NodeRecord, "node", ids, raws)

    async def update_node(self, node_id: str, mutate: Mutation[NodeRecord]) -> NodeRecord | None:
        return await self._update(self._key("node", node_id), NodeRecord, mutate)

    async def record_node_failure(
        self, node_id: str, failure_id: str, at: float, window_s: float
    ) -> int:
        """Remember a failure blamed on a node; returns how many fell within ``window_s``.

        Keyed by failure id, so recording the same failure again does not count twice.
        """
        key = self._key("node_failures", node_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(key, {failure_id: at})
            pipe.zremrangebyscore(key, "-inf", at - window_s)
            pipe.zcard(key)
            pipe.expire(key, int(window_s) + 60)
            result = await pipe.execute()
        return int(result[2])

    async def mark_drill(self, job_id: str, generation: int, fault_id: str, ttl_s: int) -> None:
        """Note that a fault was injected into ``generation`` of the job on purpose."""
        await self.redis.set(self._key("drill", job_id, str(generation)), fault_id, ex=ttl_s)

    async def drill_of(self, job_id: str, generation: int) -> str | None:
        """The injected fault of the job's ``generation``, if a drill targeted it."""
        fault_id = await self.redis.get(self._key("drill", job_id, str(generation)))
        return None if fault_id is None else str(fault_id)

    # --- plans -----------------------------------------------------------------------------

    async def next_plan_seq(self) -> int:
        return int(await self.redis.incr(self._key("plan", "seq")))

    async def save_plan(self, plan: Plan) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._key("plan", plan.id), plan.model_dump_json(), ex=7 * 24 * 3600)
            pipe.set(self._key("plan", "latest"), plan.id)
            await pipe.execute()

    async def get_plan(self, plan_id: str) -> Plan | None:
        return await self._get(self._key("plan", plan_id), Plan)

    async def latest_plan(self) -> Plan | None:
        plan_id = await self.redis.get(self._key("plan", "latest"))
        return None if plan_id is None else await self.get_plan(str(plan_id))
