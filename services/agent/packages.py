"""A job's uploaded package, unpacked on this node as the working directory of its workers.

Before it starts a worker of a job whose ``working_dir`` is ``pkg://<sha256>``, the agent
fetches the object from the packages store (:mod:`unicron.shared.bus.packages`, which checks the
sha256) and unpacks it under ``<data_dir>/workdirs/<job_id>``. Unpacking is safe (tarfile's "data"
filter: no absolute paths, no ``..``, no links that leave the directory, no devices; and a
bound on the unpacked size) and atomic (a temporary directory renamed into place), so a
half-unpacked tree is never run and later generations of the job reuse the directory.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Literal

from unicron.services.agent.api import PackageSource
from unicron.shared.bus.packages import PackageError
from unicron.shared.logging import get_logger

log = get_logger(component="packages")
MAX_UNPACKED_BYTES = 4 * 1024**3
MAX_MEMBERS = 200_000


def _confined(name: str) -> bool:
    """A relative name without ``..``: refused outright, not quietly rewritten by the filter."""
    return not name.startswith("/") and ".." not in PurePosixPath(name).parts


def unpack(data: bytes, target: Path) -> None:
    """Unpack the tar.gz ``data`` into ``target`` (which must not exist yet), all or nothing."""
    try:
        unpack_tar(io.BytesIO(data), "r:gz", target)
    except UnpackRefusedError as exc:
        if exc.exists:
            return  # another start of the job unpacked it first: theirs is as good
        raise PackageError(f"package {exc}") from exc


class UnpackRefusedError(RuntimeError):
    """A tar that is not a confined tree of bounded size, or that could not be written."""

    def __init__(self, message: str, exists: bool = False) -> None:
        super().__init__(message)
        self.exists = exists  # the target was there already


def unpack_tar(source: BinaryIO, mode: Literal["r:gz", "r:"], target: Path) -> None:
    """Unpack the tar read from ``source`` (``mode`` as tarfile's, ``r:gz`` or ``r:``) into
    ``target``, which must not exist yet: into a temporary directory renamed into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with tarfile.open(fileobj=source, mode=mode) as tar:
            members = tar.getmembers()
            if len(members) > MAX_MEMBERS:
                raise UnpackRefusedError(f"has more than {MAX_MEMBERS} entries")
            bad = next((m.name for m in members if not _confined(m.name)), None)
            if bad is not None:
                raise UnpackRefusedError(f"entry {bad!r} would land outside its directory")
            if sum(m.size for m in members) > MAX_UNPACKED_BYTES:
                raise UnpackRefusedError(f"unpacks to more than {MAX_UNPACKED_BYTES} bytes")
            tar.extractall(tmp, members=members, filter="data")
        os.rename(tmp, target)
    except (tarfile.TarError, EOFError, OSError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        exists = isinstance(exc, OSError) and target.is_dir()
        raise UnpackRefusedError(f"cannot be unpacked: {exc}", exists) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class PackageDirs:
    """Per-job working directories unpacked from packages, made once and then reused."""

    def __init__(self, source: PackageSource, data_dir: Path) -> None:
        self.source = source
        self.root = (data_dir / "workdirs").absolute()
        self._locks: dict[str, asyncio.Lock] = {}

    def path(self, job_id: str) -> Path:
        return self.root / job_id

    async def directory(self, job_id: str, sha256: str) -> Path:
        """The job's unpacked working directory; ``PackageError`` when it cannot be had."""
        target = self.path(job_id)
        lock = self._locks.setdefault(job_id, asyncio.Lock())
        async with lock:
            if target.is_dir():
                return target
            data = await self.source.package(sha256)
            await asyncio.to_thread(unpack, data, target)
        log.info("package unpacked", job_id=job_id, sha256=sha256, bytes=len(data))
        return target
