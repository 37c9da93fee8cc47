"""Records in Redis: JSON documents of pydantic models, changed only by optimistic transactions.

Any service may change a record, always through WATCH/MULTI, re-reading and re-applying its
change on conflict, so concurrent writers never lose each other's updates. A record that no
longer parses (a hand edit, a half-migrated field) is skipped by the listings and logged once
per record and process, so it never hides the others. :class:`unicron.shared.store.state.StateStore`
builds the cluster's records on this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import redis.asyncio as aioredis
from pydantic import BaseModel, ValidationError
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, WatchError
from tenacity import retry, retry_if_not_exception_type, stop_after_delay, wait_exponential
from unicron.shared.logging import get_logger

M = TypeVar("M", bound=BaseModel)
Mutation = Callable[[M], bool | None]
Also = Callable[[Pipeline, M], object]
# Records already reported as unreadable: a listing runs every few seconds; one line is enough.
_unreadable: set[tuple[str, str]] = set()


async def connect_redis(url: str, connect_timeout_s: float) -> aioredis.Redis:
    # No retries inside redis-py: its loop can swallow a cancel that lands mid-command, so a
    # cancelled task runs on; the services' own retries (shared/outage.py) take over.
    client = aioredis.Redis.from_url(
        url, decode_responses=True, health_check_interval=10, retry=Retry(NoBackoff(), 0)
    )
    await answers(client, connect_timeout_s)
    return client


async def answers(client: aioredis.Redis, timeout_s: float) -> None:
    """Wait until ``client`` answers a PING, up to ``timeout_s``; a refused login or ACL never
    heals by waiting, so it raises at once, the caller's clear error."""

    @retry(
        stop=stop_after_delay(timeout_s),
        wait=wait_exponential(0.1, max=2.0),
        retry=retry_if_not_exception_type((AuthenticationError, NoPermissionError)),
        reraise=True,
    )
    async def _ping() -> None:
        await client.ping()

    await _ping()


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


class RedisRecords:
    def __init__(self, client: aioredis.Redis, prefix: str = "unicron:") -> None:
        self.redis = client
        self.prefix = prefix

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    async def _get(self, key: str, model: type[M]) -> M | None:
        raw = await self.redis.get(key)
        return None if raw is None else model.model_validate_json(raw)

    async def _update(
        self, key: str, model: type[M], mutate: Mutation[M], also: Also[M] | None = None
    ) -> M | None:
        """Apply ``mutate`` atomically; it returns False to leave the record unwritten.
        ``also`` adds commands to the same transaction (an index of the record, say)."""
        task = asyncio.current_task()
        cancels = task.cancelling() if task else 0
        result = await self._update_watched(key, model, mutate, also)
        # redis-py's pipeline cleanup can swallow a cancel that lands during its UNWATCH; a
        # task cancelled meanwhile must still stop, or its shutdown waits on it forever.
        if task is not None and task.cancelling() > cancels:
            raise asyncio.CancelledError
        return result

    async def _update_watched(
        self, key: str, model: type[M], mutate: Mutation[M], also: Also[M] | None
    ) -> M | None:
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
                    if also is not None:
                        also(pipe, record)
                    await pipe.execute()
                    return record
                except WatchError:
                    continue

    async def once(self, key: str, ttl_s: int = 7 * 24 * 3600) -> bool:
        """True the first time ``key`` is seen: the Redis side of at-least-once de-duplication."""
        return bool(await self.redis.set(self._key("once", key), "1", nx=True, ex=ttl_s))
