"""Plain scripts' checkpoint snapshots, kept in a JetStream object store when no
``UNICRON_CHECKPOINT_URL`` is set: every node reaches the bus, so a snapshot taken on one node
restores on any other without a shared filesystem (:mod:`unicron.services.agent.mirror`).

The bucket is made with the streams (:mod:`unicron.shared.bus.streamsetup`); agents may write
and read it, nothing else. Objects expire after ``CHECKPOINTS_TTL_S`` whatever happens to
their job, so a bucket no agent cleans up does not grow without end.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig
from nats.js.errors import (
    BucketNotFoundError,
    NotFoundError,
    ObjectDeletedError,
    ObjectNotFoundError,
)
from nats.js.object_store import ObjectStore

CHECKPOINTS_BUCKET = "UNICRON_CHECKPOINTS"
CHECKPOINTS_TTL_S = 7 * 24 * 3600.0


async def checkpoint_bucket(js: JetStreamContext) -> ObjectStore:
    """The checkpoints' object store; created here only on a bus with no logins (a login's
    agent may not create it: the stream setup did)."""
    try:
        return await js.object_store(CHECKPOINTS_BUCKET)
    except BucketNotFoundError:
        return await js.create_object_store(CHECKPOINTS_BUCKET, config=checkpoints_config(1))


def checkpoints_config(replicas: int) -> ObjectStoreConfig:
    return ObjectStoreConfig(ttl=CHECKPOINTS_TTL_S, replicas=replicas)


_MISSING = (ObjectNotFoundError, ObjectDeletedError, NotFoundError)


class CheckpointObjects:
    """The snapshots' objects in the bucket, by name: what the agent's mirror stores through
    (``unicron.services.agent.api.SnapshotStore``)."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self._bucket: ObjectStore | None = None

    async def _store(self) -> ObjectStore:
        if self._bucket is None:
            self._bucket = await checkpoint_bucket(self.js)
        return self._bucket

    async def put_file(self, name: str, path: Path) -> None:
        with path.open("rb") as source:
            await (await self._store()).put(name, source)

    async def put_bytes(self, name: str, data: bytes) -> None:
        await (await self._store()).put(name, data)

    async def get_bytes(self, name: str) -> bytes | None:
        try:
            result = await (await self._store()).get(name)
        except _MISSING:
            return None
        return result.data

    async def get_file(self, name: str, path: Path) -> bool:
        try:
            with path.open("wb") as sink:
                await (await self._store()).get(name, writeinto=sink)
        except _MISSING:
            return False
        return True

    async def delete(self, name: str) -> None:
        with contextlib.suppress(*_MISSING):
            await (await self._store()).delete(name)
