"""Cluster state in Redis: jobs, nodes, plans, idempotency guards and the rebuild's counters.

Records are JSON documents of the models in :mod:`unicron.shared.contracts.models` and
:mod:`unicron.shared.contracts.plans`, changed through
:class:`unicron.shared.store.records.RedisRecords`; jobs are indexed for paging and expire after
their retention once finished (:mod:`unicron.shared.store.jobindex`); nodes by their last
heartbeat, in the same transaction as each write of a node, so the detector finds the silent
ones with one range read instead of reading every node.

With Sentinels (``UNICRON_REDIS_SENTINELS``) the store talks to whichever server is primary
(:mod:`unicron.shared.store.sentinel`); a failover is an outage of a second or two that the
services' retries ride out, and loses nothing the store reported written: every write returns
once the replica has it (``WAIT`` in the client, :mod:`unicron.shared.store.replicated`), as
re-deriving lost writes is not possible without a rebuild (the ``once`` guards, fencing epochs
and plan sequence would go backwards). With one server: no replica, no ``WAIT``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from unicron.shared.addresses import SentinelTarget
from unicron.shared.contracts.models import Job, JobSummary, NodeRecord
from unicron.shared.contracts.plans import Plan
from unicron.shared.store.calibstore import CalibrationTables
from unicron.shared.store.jobindex import (
    APPEND_JOB_SCRIPT,
    FORGET_GONE_SCRIPT,
    INDEX_STEP,
    JOB_RETENTION_S,
    JobPosition,
    finished_at,
    split_indexed,
)
from unicron.shared.store.lease import Lease, current_epoch
from unicron.shared.store.records import Mutation, RedisRecords, connect_redis, parse_each
from unicron.shared.store.sentinel import connect_sentinel

# KEYS[1] a counter; ARGV[1] its floor. Raises the counter to the floor, never lowers it.
_RAISE = """
local value = tonumber(redis.call('GET', KEYS[1]) or '0')
if value < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return tonumber(ARGV[1])
end
return value
"""


class StateStore(RedisRecords):
    def __init__(
        self, client: aioredis.Redis, prefix: str = "unicron:", retention_s: float = JOB_RETENTION_S
    ) -> None:
        super().__init__(client, prefix)
        self.job_retention_s = retention_s
        self._append_job = client.register_script(APPEND_JOB_SCRIPT)
        self._forget_gone = client.register_script(FORGET_GONE_SCRIPT)
        self.calibration = CalibrationTables(client)  # the planner's, exported by the API

    @classmethod
    async def connect(
        cls,
        url: str,
        connect_timeout_s: float = 30.0,
        job_retention_s: float = JOB_RETENTION_S,
        sentinel: SentinelTarget | None = None,
    ) -> StateStore:
        """Connect as ``url`` says, or through ``sentinel``'s Sentinels when given (then
        ``url``'s host is not used). The store reads no settings: a service passes
        ``CommonSettings.redis_sentinel`` (:mod:`unicron.shared.service`)."""
        if sentinel is None:
            client = await connect_redis(url, connect_timeout_s)
        else:
            client = await connect_sentinel(url, sentinel, connect_timeout_s)
        return cls(client, retention_s=job_retention_s)

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
        keys = [self._key("job", job.id), self._key("jobs"), self._summary_key(job.id)]
        summary = job.summary().model_dump_json()
        args = [job.model_dump_json(), repr(job.submitted_at), INDEX_STEP, job.id, summary]
        await self._append_job(keys=keys, args=args)
        await self._expire_if_finished(job)
        return job, True

    async def get_job(self, job_id: str) -> Job | None:
        return await self._get(self._key("job", job_id), Job)

    async def list_jobs(self) -> list[Job]:
        ids = [str(i) for i in await self.redis.zrange(self._key("jobs"), 0, -1)]
        if not ids:
            return []
        raws = await self.redis.mget([self._key("job", i) for i in ids])
        await self._unindex_gone([i for i, raw in zip(ids, raws, strict=True) if raw is None])
        return parse_each(Job, "job", ids, raws)

    async def update_job(self, job_id: str, mutate: Mutation[Job]) -> Job | None:
        job = await self._update(self._key("job", job_id), Job, mutate, also=self._summarise)
        if job is not None:
            await self._expire_if_finished(job)
        return job

    def _summary_key(self, job_id: str) -> str:
        return self._key("job-summary", job_id)

    def _summarise(self, pipe: Pipeline, job: Job) -> None:
        pipe.set(self._summary_key(job.id), job.summary().model_dump_json())

    async def _expire_if_finished(self, job: Job | JobSummary) -> None:
        """Give a finished job's record and summary their expiry. Again after every write:
        SET drops it."""
        ended = finished_at(job)
        if ended is not None:
            expires_ms = int((ended + self.job_retention_s) * 1000)
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.pexpireat(self._key("job", job.id), expires_ms)
                pipe.pexpireat(self._summary_key(job.id), expires_ms)
                await pipe.execute()

    async def _unindex_gone(self, job_ids: list[str]) -> None:
        if job_ids:
            keys = [self._key("jobs"), *(self._key("job", i) for i in job_ids)]
            await self._forget_gone(keys=keys, args=job_ids)

    async def index_after(
        self, position: JobPosition | None, offset: int, count: int
    ) -> list[JobPosition]:
        """Up to ``count`` entries of the job index (submission order) from ``position``'s
        score on, ties with it included, skipping the first ``offset``."""
        low: float | str = "-inf" if position is None else position.score
        entries = await self.redis.zrangebyscore(
            self._key("jobs"), low, "+inf", start=offset, num=count, withscores=True
        )
        pairs = cast(list[tuple[str, float]], entries)
        return [JobPosition(float(score), str(job_id)) for job_id, score in pairs]

    async def read_indexed(
        self, positions: list[JobPosition]
    ) -> list[tuple[JobPosition, JobSummary]]:
        """The summaries of the jobs at ``positions`` that exist, parse and are within
        retention; the index forgets the others (an expired one is deleted now if its expiry
        was never set). A job without a summary gets one from its record."""
        if not positions:
            return []
        raws = await self.redis.mget([self._summary_key(p.job_id) for p in positions])
        missing = [p.job_id for p, raw in zip(positions, raws, strict=True) if raw is None]
        records = await self.redis.mget([self._key("job", i) for i in missing]) if missing else []
        kept, gone, made = split_indexed(
            positions, raws, dict(zip(missing, records, strict=True)), self.job_retention_s
        )
        for summary in made:  # NX: a writer may have stored a newer one meanwhile
            await self.redis.set(self._summary_key(summary.id), summary.model_dump_json(), nx=True)
            await self._expire_if_finished(summary)
        if gone:
            keys = [k for i in gone for k in (self._key("job", i), self._summary_key(i))]
            await self.redis.delete(*keys)
            await self._unindex_gone(gone)
        return kept

    # --- nodes -----------------------------------------------------------------------------

    async def put_node(self, node: NodeRecord) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._key("node", node.id), node.model_dump_json())
            pipe.sadd(self._key("nodes"), node.id)
            self._index_heartbeat(pipe, node)
            await pipe.execute()

    def _index_heartbeat(self, pipe: Pipeline, node: NodeRecord) -> None:
        """Nodes by their last heartbeat: who fell silent is one range read, not a scan."""
        pipe.zadd(self._key("heartbeats"), {node.id: node.last_heartbeat})

    async def heard_before(self, at: float) -> list[tuple[str, float]]:
        """(node id, last heartbeat) of the nodes last heard before ``at``, oldest first."""
        found = await self.redis.zrangebyscore(self._key("heartbeats"), "-inf", f"({at!r}",
                                               withscores=True)  # fmt: skip
        pairs = cast(list[tuple[str, float]], found)
        return [(str(node_id), float(beat)) for node_id, beat in pairs]

    async def first_heard_after(self, at: float) -> float | None:
        """The oldest last heartbeat after ``at``: when the next node may fall silent."""
        found = await self.redis.zrangebyscore(self._key("heartbeats"), f"({at!r}", "+inf",
                                               start=0, num=1, withscores=True)  # fmt: skip
        return float(found[0][1]) if found else None

    async def get_node(self, node_id: str) -> NodeRecord | None:
        return await self._get(self._key("node", node_id), NodeRecord)

    async def list_nodes(self) -> list[NodeRecord]:
        return await self.get_nodes(str(i) for i in await self.redis.smembers(self._key("nodes")))

    async def get_nodes(self, node_ids: Iterable[str]) -> list[NodeRecord]:
        """The records of ``node_ids`` that exist, in one read whatever their number."""
        ids = sorted(set(node_ids))
        if not ids:
            return []
        raws = await self.redis.mget([self._key("node", i) for i in ids])
        return parse_each(NodeRecord, "node", ids, raws)

    async def update_node(self, node_id: str, mutate: Mutation[NodeRecord]) -> NodeRecord | None:
        key = self._key("node", node_id)
        return await self._update(key, NodeRecord, mutate, also=self._index_heartbeat)

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

    # --- the cluster marker and counters, for a rebuild (docs/design.md §6) ---------------

    async def cluster_marker(self) -> str | None:
        """The id of this Redis's incarnation of the cluster; None when Redis lost its data
        (or never had any): the job records must then be rebuilt from the bus and agents."""
        value = await self.redis.get(self._key("cluster"))
        return None if value is None else str(value)

    async def mark_cluster(self, incarnation: str) -> bool:
        """Set the marker, unless one is set already; True when this call set it."""
        return bool(await self.redis.set(self._key("cluster"), incarnation, nx=True))

    async def restore_job(self, job: Job) -> bool:
        """Store a rebuilt job unless a record of it exists; True when this call stored it."""
        key = self._key("job", job.id)
        stored = bool(await self.redis.set(key, job.model_dump_json(), nx=True))
        await self.redis.zadd(self._key("jobs"), {job.id: job.submitted_at}, nx=True)
        if stored:  # a rebuilt finished job keeps no longer than any other
            await self.redis.set(self._summary_key(job.id), job.summary().model_dump_json())
            await self._expire_if_finished(job)
        return stored

    async def raise_counter(self, key: str, floor: int) -> int:
        """Raise the counter at the full ``key`` to at least ``floor``; returns its value."""
        return int(await self.redis.eval(_RAISE, 1, key, floor))

    async def raise_plan_seq(self, floor: int) -> int:
        """Raise the plan sequence so the next plan is numbered above ``floor``."""
        return await self.raise_counter(self._key("plan", "seq"), floor)

    # --- leases (shared/store/lease.py) ----------------------------------------------------------

    def lease(self, name: str, ttl_s: float, instance: str | None = None) -> Lease:
        """The lease ``name`` under this store's prefix, not yet taken."""
        return Lease(self.redis, name, ttl_s, prefix=self.prefix, instance=instance)

    async def current_epoch(self, lease: str) -> int:
        """The fencing epoch of the latest holder of ``lease``; 0 when nobody ever held it."""
        return await current_epoch(self.redis, lease, self.prefix)
