"""A plain script's checkpoint directory follows its job from node to node.

A script writes its checkpoints under ``$UNICRON_CHECKPOINT_DIR``, which is a directory on the
node of its rank 0 (``unicron.services.agent.prepare.checkpoint_dir``). While a rank 0 of an
entrypoint job runs here, this mirror looks at that directory every ``interval_s`` and, when it
changed and has been still for ``QUIET_S`` (a checkpoint is not half-written), packs it into a
tar and keeps it in a snapshot store every node reaches (``unicron.services.agent.snapshots``),
with a manifest (``CheckpointSnapshot``) written after the data. When the rank 0 is gone it
packs the directory once more: the script can no longer be writing.

Before a rank 0 starts, the agent restores the job's newest snapshot here when it is newer than
what the directory holds: a later generation wins, then a later write. The download is checked
against the manifest's size and sha256 and unpacked beside the directory, then swapped in, so
a start never sees half a restore. A restart that moves rank 0 therefore resumes from the last
snapshot taken, at most one interval older than the script's last checkpoint; one that keeps
rank 0 on its node uses the directory as it is.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
import tarfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path

from pydantic import ValidationError
from unicron.services.agent.api import SnapshotStore
from unicron.services.agent.packages import UnpackRefusedError, unpack_tar
from unicron.services.agent.prepare import checkpoint_dir
from unicron.services.agent.workers import Worker
from unicron.shared.contracts.checkpoints import CheckpointSnapshot
from unicron.shared.logging import get_logger
from unicron.shared.outage import Outage

log = get_logger(component="mirror")
QUIET_S = 1.0  # a file written more recently may be half-written
Files = tuple[tuple[str, int, int], ...]  # (relative path, size, mtime_ns), sorted


def scan(directory: Path) -> Files:
    """The regular files under ``directory`` (links are not followed nor kept)."""
    found: list[tuple[str, int, int]] = []
    for root, _dirs, names in os.walk(directory):
        for name in names:
            path = Path(root, name)
            with suppress(FileNotFoundError):
                info = path.lstat()
                if stat.S_ISREG(info.st_mode):
                    found.append((str(path.relative_to(directory)), info.st_size, info.st_mtime_ns))
    return tuple(sorted(found))


def newest_mtime(files: Files) -> int:
    """When the newest of ``files`` was written (ns); -1 for none."""
    return max((mtime for _name, _size, mtime in files), default=-1)


def pack(directory: Path, files: Files, tar_path: Path) -> tuple[int, str]:
    """Write ``files`` of ``directory`` to ``tar_path``; its size and sha256."""
    with tarfile.open(tar_path, "w") as tar:
        for name, _size, _mtime in files:
            tar.add(directory / name, arcname=name, recursive=False)
    with tar_path.open("rb") as packed:
        digest = hashlib.file_digest(packed, "sha256").hexdigest()
        return packed.tell(), digest


class CheckpointMirror:
    def __init__(
        self,
        store: SnapshotStore,
        checkpoints: Path,
        node_id: str,
        live: Callable[[], list[Worker]],
        job_over: Callable[[str], Awaitable[bool]],
        interval_s: float = 5.0,
        max_bytes: int | None = None,
    ) -> None:
        self.store = store
        self.checkpoints = checkpoints
        self.work = checkpoints / ".mirror"  # its own records and tars, beside the directories
        self.node_id = node_id
        self.live = live
        self.job_over = job_over
        self.interval_s = interval_s
        self.max_bytes = max_bytes
        self._mirrored: dict[str, int] = {}  # job → generation of its rank 0 here
        self._sent: dict[str, Files] = {}  # job → the files its newest snapshot holds
        self._locks: dict[str, asyncio.Lock] = {}
        self._too_big: set[str] = set()

    async def run(self) -> None:
        outage = Outage("checkpoint mirror", component="mirror")
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.tick()
                outage.ok()
            except Exception as exc:
                outage.failed(exc)

    async def tick(self) -> None:
        """Snapshot the directory of every rank 0 running here, and once more of each gone."""
        running = {
            w.key.job_id: w.key.generation for w in self.live() if w.plain and w.current.rank == 0
        }
        for job_id, generation in running.items():
            await self.snapshot(job_id, generation)
        for job_id in set(self._mirrored) - set(running):
            await self.snapshot(job_id, self._mirrored.pop(job_id), final=True)
            if await self.job_over(job_id):
                await self.forget(job_id)
        self._mirrored.update(running)

    async def snapshot(
        self, job_id: str, generation: int, final: bool = False
    ) -> CheckpointSnapshot | None:
        """Send the job's directory when it changed since the last snapshot; the manifest sent,
        or None when there was nothing (new, still) to send."""
        async with self._lock(job_id):
            directory = checkpoint_dir(self.checkpoints, job_id)
            files = await asyncio.to_thread(scan, directory)
            if not files or files == self._sent.get(job_id):
                return None
            if not final and time.time_ns() - newest_mtime(files) < QUIET_S * 1e9:
                return None
            return await self._send(job_id, generation, directory, files)

    async def _send(
        self, job_id: str, generation: int, directory: Path, files: Files
    ) -> CheckpointSnapshot | None:
        jlog = log.bind(job_id=job_id, generation=generation)
        self.work.mkdir(parents=True, exist_ok=True)
        tar_path = self.work / f"{job_id}-{uuid.uuid4().hex}.tar"
        try:
            size, digest = await asyncio.to_thread(pack, directory, files, tar_path)
            if await asyncio.to_thread(scan, directory) != files:
                return None  # written to while packed: the next tick tries again
            if self.max_bytes is not None and size > self.max_bytes:
                if job_id not in self._too_big:
                    self._too_big.add(job_id)
                    why = "too big for the bus; set UNICRON_CHECKPOINT_URL to object storage"
                    jlog.warning(f"checkpoint directory not mirrored: {why}", bytes=size)
                return None
            newest = newest_mtime(files)
            blob = f"{job_id}/{generation}-{newest}-{digest[:16]}.tar"
            made = CheckpointSnapshot(
                job_id=job_id, generation=generation, node_id=self.node_id,
                newest_mtime_ns=newest, files=len(files), size=size, sha256=digest, blob=blob,
            )  # fmt: skip
            remote = await self.newest(job_id)
            if remote is not None and remote.order > made.order:
                jlog.info("a newer snapshot is kept elsewhere; not sent", newer=remote.node_id)
                return None
            if remote != made:  # the same bytes are there already after an agent restart
                await self._put(made, tar_path, remote)
        finally:
            tar_path.unlink(missing_ok=True)
        self._sent[job_id] = files
        self._record(made)
        jlog.info("checkpoint directory mirrored", files=len(files), bytes=size)
        return made

    async def _put(
        self, made: CheckpointSnapshot, tar_path: Path, replaced: CheckpointSnapshot | None
    ) -> None:
        """The data, then the manifest that vouches for it, then the data it replaces."""
        await self.store.put_file(made.blob, tar_path)
        await self.store.put_bytes(_manifest(made.job_id), made.model_dump_json().encode())
        if replaced is not None and replaced.blob != made.blob:
            await self.store.delete(replaced.blob)

    async def newest(self, job_id: str) -> CheckpointSnapshot | None:
        """The manifest of the job's newest complete snapshot, if any."""
        raw = await self.store.get_bytes(_manifest(job_id))
        if raw is None:
            return None
        try:
            return CheckpointSnapshot.model_validate_json(raw)
        except ValidationError:
            log.warning("snapshot manifest unreadable; ignored", job_id=job_id)
            return None

    async def restore(self, job_id: str) -> CheckpointSnapshot | None:
        """Put the job's newest snapshot in its directory here when it is newer than what the
        directory holds; the snapshot restored, or None. A store that cannot be read leaves the
        directory as it is: the script starts from what this node has."""
        async with self._lock(job_id):
            jlog = log.bind(job_id=job_id)
            try:
                remote = await self.newest(job_id)
                directory = checkpoint_dir(self.checkpoints, job_id)
                files = await asyncio.to_thread(scan, directory)
                if remote is None or remote.order <= self._local_order(job_id, files):
                    return None
                await self._fetch(remote, directory)
            except (OSError, UnpackRefusedError, SnapshotMismatchError) as exc:
                jlog.error("checkpoint snapshot not restored", error=str(exc))
                return None
            except Exception as exc:  # the store's own errors: an outage, a refused login
                jlog.error("checkpoint snapshot not restored", error=repr(exc))
                return None
            self._sent[job_id] = await asyncio.to_thread(scan, directory)
            self._record(remote)
            jlog.info("checkpoint directory restored", generation=remote.generation,
                      from_node=remote.node_id, files=remote.files, bytes=remote.size)  # fmt: skip
            return remote

    async def _fetch(self, snapshot: CheckpointSnapshot, directory: Path) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        tar_path = self.work / f"{snapshot.job_id}-{uuid.uuid4().hex}.tar"
        try:
            if not await self.store.get_file(snapshot.blob, tar_path):
                raise SnapshotMismatchError(f"{snapshot.blob} is missing from the store")
            await asyncio.to_thread(_swap_in, snapshot, tar_path, directory)
        finally:
            tar_path.unlink(missing_ok=True)

    async def forget(self, job_id: str) -> None:
        """The job is over: its snapshot and this node's record of it go."""
        async with self._lock(job_id):
            remote = await self.newest(job_id)
            if remote is not None:
                await self.store.delete(_manifest(job_id))
                await self.store.delete(remote.blob)
            self._sent.pop(job_id, None)
            (self.work / f"{job_id}.json").unlink(missing_ok=True)
        self._locks.pop(job_id, None)

    def _lock(self, job_id: str) -> asyncio.Lock:
        return self._locks.setdefault(job_id, asyncio.Lock())

    def _record(self, snapshot: CheckpointSnapshot) -> None:
        """What the directory here last matched: survives an agent restart."""
        self.work.mkdir(parents=True, exist_ok=True)
        path = self.work / f"{snapshot.job_id}.json"
        path.with_suffix(".tmp").write_text(snapshot.model_dump_json())
        path.with_suffix(".tmp").replace(path)

    def _local_order(self, job_id: str, files: Files) -> tuple[int, int]:
        """Where the directory here stands against a snapshot: the generation of the snapshot
        it last matched (-1: none), and its newest file (-1: empty)."""
        newest = newest_mtime(files)
        if not files:
            return (-1, newest)
        try:
            raw = (self.work / f"{job_id}.json").read_bytes()
            return (CheckpointSnapshot.model_validate_json(raw).generation, newest)
        except (OSError, ValidationError):
            return (-1, newest)


class SnapshotMismatchError(RuntimeError):
    """A snapshot's bytes are missing or not those its manifest vouches for."""


def _manifest(job_id: str) -> str:
    return f"{job_id}/manifest.json"


def _swap_in(snapshot: CheckpointSnapshot, tar_path: Path, directory: Path) -> None:
    """Check the tar against its manifest, unpack it beside ``directory``, swap it in."""
    with tar_path.open("rb") as packed:
        digest = hashlib.file_digest(packed, "sha256").hexdigest()
        if (packed.tell(), digest) != (snapshot.size, snapshot.sha256):
            raise SnapshotMismatchError(f"{snapshot.blob} does not match its manifest")
        packed.seek(0)
        staged = directory.with_name(f".{directory.name}-{uuid.uuid4().hex}")
        unpack_tar(packed, "r:", staged)
    old = directory.with_name(f".{directory.name}-old-{uuid.uuid4().hex}")
    if directory.exists():
        directory.rename(old)
    staged.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
