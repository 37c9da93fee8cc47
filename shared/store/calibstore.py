"""Where the planner's calibration lives in Redis, for
:class:`unicron.shared.store.state.StateStore`.

Two hashes of JSON records, ``<prefix>jobs`` (per job) and ``<prefix>transitions`` (per
transition kind), one JSON document of decayed failure counts, ``<prefix>failures``, and the
exported snapshot at :data:`unicron.shared.contracts.calibration.CALIBRATION_KEY`. What the records
mean is the planner's (``unicron.services.planner.calibration``); this module only reads and writes
them.
"""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis
from unicron.shared.contracts.calibration import CALIBRATION_KEY, CalibrationRecord

CALIBRATION_PREFIX = "unicron:planner:calib:"
JOB_TABLE, TRANSITION_TABLE = "jobs", "transitions"


class CalibrationTables:
    def __init__(self, client: aioredis.Redis, prefix: str = CALIBRATION_PREFIX) -> None:
        self._redis = client
        self.prefix = prefix

    async def record(self, table: str, name: str) -> dict[str, Any]:
        """The record ``name`` of ``table`` (:data:`JOB_TABLE` or :data:`TRANSITION_TABLE`); {}
        if none."""
        raw = await self._redis.hget(self.prefix + table, name)
        return dict(json.loads(raw)) if raw else {}

    async def put_record(self, table: str, name: str, record: dict[str, Any]) -> None:
        await self._redis.hset(self.prefix + table, name, json.dumps(record))

    async def drop_record(self, table: str, name: str) -> None:
        await self._redis.hdel(self.prefix + table, name)

    async def records(self, table: str) -> dict[str, dict[str, Any]]:
        raws = await self._redis.hgetall(self.prefix + table)
        return {str(name): dict(json.loads(raw)) for name, raw in raws.items()}

    async def failure_counts(self) -> dict[str, float]:
        raw = await self._redis.get(self.prefix + "failures")
        return {k: float(v) for k, v in json.loads(raw).items()} if raw else {}

    async def put_failure_counts(self, counts: dict[str, float]) -> None:
        await self._redis.set(self.prefix + "failures", json.dumps(counts))

    async def snapshot(self) -> CalibrationRecord | None:
        """The record the API exports; None before the planner's first planning pass."""
        raw = await self._redis.get(CALIBRATION_KEY)
        return None if raw is None else CalibrationRecord.model_validate_json(raw)

    async def save_snapshot(self, record: CalibrationRecord) -> None:
        await self._redis.set(CALIBRATION_KEY, record.model_dump_json())
