"""The state store in memory, for unit tests only: :class:`MemoryStore` is a
:class:`unicron.shared.store.api.JobStore` like :class:`unicron.shared.store.state.StateStore`,
without Redis.

Records are kept as the JSON Redis would hold, under the same keys and with the same expiries,
so a test sees what it would see on Redis: each read parses a fresh copy, a record that does
not parse is skipped by the listings, and a finished job is gone after its retention. A change
is atomic because nothing awaits between its read and its write. Several stores opened on one
:class:`MemoryKeys` share it, as clients of one Redis do.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel
from unicron.shared.contracts.models import Job, JobSummary, NodeRecord
from unicron.shared.contracts.plans import Plan
from unicron.shared.store.api import JobStore
from unicron.shared.store.jobindex import (
    INDEX_STEP,
    JOB_RETENTION_S,
    JobPosition,
    finished_at,
    split_indexed,
)
from unicron.shared.store.lease import lease_keys
from unicron.shared.store.records import M, Mutation, parse_each

WEEK_S = 7 * 24 * 3600


@dataclass
class MemoryKeys:
    """The "server": string values, sorted sets, and each key's expiry (``time.time()``)."""

    values: dict[str, str] = field(default_factory=dict)
    zsets: dict[str, dict[str, float]] = field(default_factory=dict)
    expires: dict[str, float] = field(default_factory=dict)

    def _alive(self, key: str) -> bool:
        if self.expires.get(key, float("inf")) > time.time():
            return True
        self.delete(key)
        return False

    def get(self, key: str) -> str | None:
        return self.values.get(key) if self._alive(key) else None

    def set(self, key: str, value: str, nx: bool = False, ex: float | None = None) -> bool:
        if nx and self.get(key) is not None:
            return False
        self.values[key] = value
        self.expires.pop(key, None)  # as SET does
        if ex is not None:
            self.expires[key] = time.time() + ex
        return True

    def delete(self, key: str) -> None:
        self.values.pop(key, None)
        self.zsets.pop(key, None)
        self.expires.pop(key, None)

    def zset(self, key: str) -> dict[str, float]:
        """The sorted set at ``key`` (member → score), made empty when absent or expired."""
        if not self._alive(key) or key not in self.zsets:
            self.zsets[key] = {}
        return self.zsets[key]


class MemoryStore:
    def __init__(
        self,
        keys: MemoryKeys | None = None,
        prefix: str = "unicron:",
        job_retention_s: float = JOB_RETENTION_S,
    ) -> None:
        self.keys = keys or MemoryKeys()
        self.prefix = prefix
        self.job_retention_s = job_retention_s

    async def close(self) -> None:
        """Nothing to close: another store may still share the keys."""

    async def ping(self) -> bool:
        return True

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def _get(self, key: str, model: type[M]) -> M | None:
        raw = self.keys.get(key)
        return None if raw is None else model.model_validate_json(raw)

    def _update(self, key: str, model: type[M], mutate: Mutation[M]) -> M | None:
        record = self._get(key, model)
        if record is None or mutate(record) is False:
            return record
        self._put(key, record)
        return record

    def _put(self, key: str, record: BaseModel) -> None:
        self.keys.set(key, record.model_dump_json())

    async def once(self, key: str, ttl_s: int = WEEK_S) -> bool:
        return self.keys.set(self._key("once", key), "1", nx=True, ex=ttl_s)

    # --- jobs ------------------------------------------------------------------------------

    async def create_job(self, job: Job, idempotency_key: str | None = None) -> tuple[Job, bool]:
        if idempotency_key is not None:
            idem = self._key("idem", idempotency_key)
            if not self.keys.set(idem, job.id, nx=True, ex=WEEK_S):
                existing = self._get(self._key("job", self.keys.get(idem) or ""), Job)
                if existing is not None:
                    return existing, False
                self.keys.set(idem, job.id, ex=WEEK_S)
        index = self.keys.zset(self._key("jobs"))
        score, last = job.submitted_at, max(index.values(), default=None)
        if last is not None and last >= score:  # always after every job already indexed
            score = last + float(INDEX_STEP)
        self._put(self._key("job", job.id), job)
        self._put(self._summary_key(job.id), job.summary())
        index[job.id] = score
        self._expire_if_finished(job)
        return job, True

    async def get_job(self, job_id: str) -> Job | None:
        return self._get(self._key("job", job_id), Job)

    async def list_jobs(self) -> list[Job]:
        ids = [p.job_id for p in self._positions()]
        raws: list[str | bytes | None] = [self.keys.get(self._key("job", i)) for i in ids]
        self._unindex_gone([i for i, raw in zip(ids, raws, strict=True) if raw is None])
        return parse_each(Job, "job", ids, raws)

    async def update_job(self, job_id: str, mutate: Mutation[Job]) -> Job | None:
        before = self.keys.get(self._key("job", job_id))
        job = self._update(self._key("job", job_id), Job, mutate)
        if job is not None and self.keys.get(self._key("job", job_id)) != before:
            self._put(self._summary_key(job.id), job.summary())
        if job is not None:
            self._expire_if_finished(job)
        return job

    def _summary_key(self, job_id: str) -> str:
        return self._key("job-summary", job_id)

    def _expire_if_finished(self, job: Job | JobSummary) -> None:
        ended = finished_at(job)
        for key in (self._key("job", job.id), self._summary_key(job.id)):
            if ended is not None and self.keys.get(key) is not None:
                self.keys.expires[key] = ended + self.job_retention_s

    def _positions(self) -> list[JobPosition]:
        index = self.keys.zset(self._key("jobs"))
        return sorted(JobPosition(score, job_id) for job_id, score in index.items())

    def _unindex_gone(self, job_ids: list[str]) -> None:
        index = self.keys.zset(self._key("jobs"))
        for job_id in job_ids:
            if self.keys.get(self._key("job", job_id)) is None:
                index.pop(job_id, None)

    async def index_after(
        self, position: JobPosition | None, offset: int, count: int
    ) -> list[JobPosition]:
        low = float("-inf") if position is None else position.score
        return [p for p in self._positions() if p.score >= low][offset : offset + count]

    async def read_indexed(
        self, positions: list[JobPosition]
    ) -> list[tuple[JobPosition, JobSummary]]:
        raws: list[str | bytes | None] = [
            self.keys.get(self._summary_key(p.job_id)) for p in positions
        ]
        records: dict[str, str | bytes | None] = {
            p.job_id: self.keys.get(self._key("job", p.job_id))
            for p, raw in zip(positions, raws, strict=True)
            if raw is None
        }
        kept, gone, made = split_indexed(positions, raws, records, self.job_retention_s)
        for summary in made:
            self.keys.set(self._summary_key(summary.id), summary.model_dump_json(), nx=True)
            self._expire_if_finished(summary)
        for job_id in gone:
            self.keys.delete(self._key("job", job_id))
            self.keys.delete(self._summary_key(job_id))
        self._unindex_gone(gone)
        return kept

    # --- nodes and drills ------------------------------------------------------------------

    async def put_node(self, node: NodeRecord) -> None:
        self._put(self._key("node", node.id), node)
        self.keys.zset(self._key("nodes"))[node.id] = 0.0
        self.keys.zset(self._key("heartbeats"))[node.id] = node.last_heartbeat

    async def heard_before(self, at: float) -> list[tuple[str, float]]:
        beats = self.keys.zset(self._key("heartbeats")).items()
        return sorted(((n, b) for n, b in beats if b < at), key=lambda nb: (nb[1], nb[0]))

    async def first_heard_after(self, at: float) -> float | None:
        return min((b for b in self.keys.zset(self._key("heartbeats")).values() if b > at),
                   default=None)  # fmt: skip

    async def get_node(self, node_id: str) -> NodeRecord | None:
        return self._get(self._key("node", node_id), NodeRecord)

    async def list_nodes(self) -> list[NodeRecord]:
        return await self.get_nodes(self.keys.zset(self._key("nodes")))

    async def get_nodes(self, node_ids: Iterable[str]) -> list[NodeRecord]:
        ids = sorted(set(node_ids))
        raws: list[str | bytes | None] = [self.keys.get(self._key("node", i)) for i in ids]
        return parse_each(NodeRecord, "node", ids, raws)

    async def update_node(self, node_id: str, mutate: Mutation[NodeRecord]) -> NodeRecord | None:
        node = self._update(self._key("node", node_id), NodeRecord, mutate)
        if node is not None:
            self.keys.zset(self._key("heartbeats"))[node.id] = node.last_heartbeat
        return node

    async def record_node_failure(
        self, node_id: str, failure_id: str, at: float, window_s: float
    ) -> int:
        key = self._key("node_failures", node_id)
        failures = self.keys.zset(key)
        failures[failure_id] = at
        for old in [f for f, seen in failures.items() if seen <= at - window_s]:
            del failures[old]
        self.keys.expires[key] = time.time() + int(window_s) + 60
        return len(failures)

    async def mark_drill(self, job_id: str, generation: int, fault_id: str, ttl_s: int) -> None:
        self.keys.set(self._key("drill", job_id, str(generation)), fault_id, ex=ttl_s)

    async def drill_of(self, job_id: str, generation: int) -> str | None:
        return self.keys.get(self._key("drill", job_id, str(generation)))

    # --- plans, and the marker and counters of a rebuild -----------------------------------

    async def next_plan_seq(self) -> int:
        key = self._key("plan", "seq")
        value = int(self.keys.get(key) or 0) + 1
        self.keys.set(key, str(value))
        return value

    async def save_plan(self, plan: Plan) -> None:
        self.keys.set(self._key("plan", plan.id), plan.model_dump_json(), ex=WEEK_S)
        self.keys.set(self._key("plan", "latest"), plan.id)

    async def get_plan(self, plan_id: str) -> Plan | None:
        return self._get(self._key("plan", plan_id), Plan)

    async def latest_plan(self) -> Plan | None:
        plan_id = self.keys.get(self._key("plan", "latest"))
        return None if plan_id is None else await self.get_plan(plan_id)

    async def cluster_marker(self) -> str | None:
        return self.keys.get(self._key("cluster"))

    async def mark_cluster(self, incarnation: str) -> bool:
        return self.keys.set(self._key("cluster"), incarnation, nx=True)

    async def restore_job(self, job: Job) -> bool:
        stored = self.keys.set(self._key("job", job.id), job.model_dump_json(), nx=True)
        self.keys.zset(self._key("jobs")).setdefault(job.id, job.submitted_at)
        if stored:
            self._put(self._summary_key(job.id), job.summary())
            self._expire_if_finished(job)
        return stored

    async def raise_counter(self, key: str, floor: int) -> int:
        value = int(self.keys.get(key) or 0)
        if value < floor:
            self.keys.set(key, str(floor))
            return floor
        return value

    async def raise_plan_seq(self, floor: int) -> int:
        return await self.raise_counter(self._key("plan", "seq"), floor)

    async def current_epoch(self, lease: str) -> int:
        return int(self.keys.get(lease_keys(lease, self.prefix)[1]) or 0)


if TYPE_CHECKING:  # mypy checks here that the memory store keeps to the protocol
    _CONFORMS: type[JobStore] = MemoryStore
