"""The stores a script's checkpoint snapshots go to, behind one small interface
(``unicron.services.agent.api.SnapshotStore``): object storage at ``UNICRON_CHECKPOINT_URL``
(any fsspec URL: ``s3://``, ``gs://``, ``file://``), or by default the bus's own object store,
which every node reaches without a shared filesystem or credentials of its own.

The bus holds what a demo or a small cluster writes; a checkpoint of a large model belongs in
object storage, so the mirror refuses to send more than ``UNICRON_CHECKPOINT_MIRROR_MAX_BYTES``
over the bus and says which setting to use instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]
from unicron.services.agent.api import SnapshotStore


class UrlSnapshots:
    """Snapshots under ``<url>/`` in object storage, read and written through fsspec in a
    thread; its endpoint and credentials are the ones the storage library reads itself."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        # a fresh client: a cached one may carry another endpoint or stale listings
        self._fs: Any
        self._fs, self._root = fsspec.core.url_to_fs(self.url, skip_instance_cache=True)

    def _path(self, name: str) -> str:
        path = f"{self._root}/{name}"
        if isinstance(self._fs, LocalFileSystem):
            self._fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        return path

    async def put_file(self, name: str, path: Path) -> None:
        await asyncio.to_thread(self._fs.put_file, str(path), self._path(name))

    async def put_bytes(self, name: str, data: bytes) -> None:
        await asyncio.to_thread(self._fs.pipe_file, self._path(name), data)

    async def get_bytes(self, name: str) -> bytes | None:
        try:
            data: bytes = await asyncio.to_thread(self._fs.cat_file, self._path(name))
        except FileNotFoundError:
            return None
        return data

    async def get_file(self, name: str, path: Path) -> bool:
        try:
            await asyncio.to_thread(self._fs.get_file, self._path(name), str(path))
        except FileNotFoundError:
            return False
        return True

    async def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(self._fs.rm_file, self._path(name))


def snapshot_store(url: str | None, bus: Callable[[], SnapshotStore]) -> SnapshotStore:
    """Object storage when a URL is set, else the bus's store
    (``unicron.shared.bus.checkpoints.CheckpointObjects``)."""
    return UrlSnapshots(url) if url else bus()
