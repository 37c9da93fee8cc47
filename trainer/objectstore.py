"""A job's checkpoints in object storage, for restarts that no surviving node can serve.

With ``UNICRON_CHECKPOINT_URL`` set (``s3://bucket/prefix``, or any fsspec URL: ``file://``,
``memory://``, ``gs://`` with its package), the rank that writes rank 0's node copy also
uploads it to ``<url>/<job_id>/step-<n>.pt``, in a background thread so training does not
wait. Object stores have no rename, so a checkpoint is complete only once its *marker*
``step-<n>.done`` exists: a small JSON object with the step, the size and the SHA-256 of the
data, written after the data. A reader lists markers, never data objects, and checks the size
and digest of what it downloads, so an upload cut short (the process exited, the network
failed, a re-upload is under way) is never taken for a checkpoint. Only the newest few are
kept; pruning deletes the marker before the data.

The endpoint and credentials are the ones the storage library reads for itself: for S3 the
usual ``AWS_*`` variables, ``AWS_ENDPOINT_URL`` for a server other than AWS (MinIO, moto), or
fsspec's ``FSSPEC_S3_ENDPOINT_URL``. A worker inherits them from its agent or the job's env.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]
from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped]
from unicron.shared.logging import get_logger
from unicron.trainer.checkpoint import KEEP_LAST, checkpoint_path

log = get_logger(component="unicron.trainer.objectstore")

_MARKER = re.compile(r"^step-(\d+)\.done$")
_DATA = re.compile(r"^step-(\d+)\.pt$")


class RemoteCheckpoints:
    """The checkpoints of one job under ``<url>/<job_id>``. Reads swallow storage errors
    (a restart goes on with what the nodes hold); :meth:`upload` raises them."""

    def __init__(self, url: str, job_id: str, keep_last: int = KEEP_LAST) -> None:
        self.url = f"{url.rstrip('/')}/{job_id}"
        self.keep_last = keep_last
        # A fresh client: a cached one may carry another endpoint or stale listings.
        self._fs: Any
        self._fs, self._root = fsspec.core.url_to_fs(self.url, skip_instance_cache=True)

    def steps(self) -> list[int]:
        """Steps with a complete upload (a marker), oldest first; [] when unreachable."""
        try:
            return sorted(step for step, name in self._listing() if _MARKER.match(name))
        except Exception as exc:
            log.warning("cannot list the checkpoint store", url=self.url, error=str(exc))
            return []

    def upload(self, step: int, path: Path) -> None:
        """Upload the local checkpoint ``path`` of ``step``, then its marker; prune."""
        with path.open("rb") as source:
            digest = hashlib.file_digest(source, "sha256").hexdigest()
            size = source.tell()
        if isinstance(self._fs, LocalFileSystem):
            self._fs.makedirs(self._root, exist_ok=True)
        marker, data = self._key(step, "done"), self._key(step, "pt")
        # A marker of an earlier upload of this step must not vouch for the new bytes.
        with contextlib.suppress(FileNotFoundError):
            self._fs.rm_file(marker)
        self._fs.put_file(str(path), data)
        manifest = {"step": step, "size": size, "sha256": digest}
        self._fs.pipe_file(marker, json.dumps(manifest).encode())
        self._prune()

    def download(self, step: int, directory: str | Path) -> Path | None:
        """Fetch ``step`` into ``directory`` as a node copy (atomically); None when it is
        missing, incomplete or does not match its marker."""
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".step-{step}.", suffix=".download", dir=root)
        os.close(fd)
        try:
            manifest = json.loads(self._fs.cat_file(self._key(step, "done")))
            self._fs.get_file(self._key(step, "pt"), tmp_name)
            with open(tmp_name, "rb") as got:
                digest = hashlib.file_digest(got, "sha256").hexdigest()
                size = got.tell()
            if (manifest["step"], manifest["size"], manifest["sha256"]) != (step, size, digest):
                raise ValueError("the object does not match its marker")
            final = checkpoint_path(root, step)
            os.replace(tmp_name, final)
            return final
        except Exception as exc:
            log.warning("cannot download a checkpoint", url=self.url, step=step, error=str(exc))
            return None
        finally:
            Path(tmp_name).unlink(missing_ok=True)

    def _prune(self) -> None:
        listing = self._listing()
        complete = sorted(step for step, name in listing if _MARKER.match(name))
        if not complete:
            return
        kept = complete[-self.keep_last :]
        for step in complete[: -self.keep_last]:
            self._fs.rm_file(self._key(step, "done"))  # first: a reader never sees it half gone
        # Data of pruned steps, and of uploads that never finished, older than what is kept.
        for step, name in listing:
            if _DATA.match(name) and step < kept[0]:
                self._fs.rm_file(self._key(step, "pt"))

    def _listing(self) -> list[tuple[int, str]]:
        """``(step, name)`` of every object that names a step (markers and data)."""
        self._fs.invalidate_cache(self._root)
        try:
            entries = self._fs.ls(self._root, detail=False)
        except FileNotFoundError:  # nothing uploaded yet
            return []
        found = []
        for entry in entries:
            name = str(entry).rstrip("/").rsplit("/", 1)[-1]
            match = _MARKER.match(name) or _DATA.match(name)
            if match:
                found.append((int(match.group(1)), name))
        return found

    def _key(self, step: int, suffix: str) -> str:
        return f"{self._root}/step-{step}.{suffix}"


class Uploader:
    """One background thread that uploads the newest checkpoint handed to it; one still
    waiting when a newer comes is skipped (the newer supersedes it)."""

    def __init__(self, remote: RemoteCheckpoints) -> None:
        self.remote = remote
        self._changed = threading.Condition()
        self._waiting: tuple[int, Path] | None = None
        self._busy = False
        self._thread: threading.Thread | None = None

    def submit(self, step: int, path: Path) -> None:
        with self._changed:
            self._waiting = (step, path)
            if self._thread is None:
                # A daemon: a process that exits abandons an upload, which leaves no marker.
                self._thread = threading.Thread(target=self._run, name="upload", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def wait(self, timeout_s: float) -> bool:
        """Wait until everything submitted is uploaded (or failed); False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._waiting is None and not self._busy, timeout_s
            )

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._waiting is not None)
                assert self._waiting is not None
                (step, path), self._waiting = self._waiting, None
                self._busy = True
            try:
                self.remote.upload(step, path)
            except Exception as exc:  # the next checkpoint tries again; the node copy stays
                log.warning("checkpoint upload failed", url=self.remote.url, error=str(exc))
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()
