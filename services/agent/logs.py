"""Serves this node's worker output to the API on ``unicron.agents.<node>.logs``.

Each worker writes to the file of its launch key (``Supervisor.log_path``; a warm spare's file
is moved there when it takes a launch). A worker that re-forms in place keeps its process, so
its output for later generations stays in that file: on each regroup this module links the new
identity's file name to the launch file (``g3-r1.log -> g2-r0.log``). The link lives beside the
log, so a request for any (generation, rank) the process served finds it, also after the
process exited. Paths are only ever built from a validated job id and two integers; reads run
in a thread and return at most ``LogsRequest.max_bytes``.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pydantic import ValidationError
from unicron.services.agent.api import Replier
from unicron.services.agent.supervisor import _SAFE_ID, Supervisor, Worker
from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.logs import LogsReply, LogsRequest, logs_subject
from unicron.shared.logging import get_logger

log = get_logger(component="logs")
ALIAS = re.compile(r"^g(\d+)-r(\d+)\.log$")
BLOCK = 64 * 1024
# A tail never scans further back than this: a log of few, huge lines must not be read whole.
TAIL_SCAN_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Chunk:
    data: bytes
    offset: int
    size: int


class LogServer:
    def __init__(
        self,
        node_id: str,
        log_path: Callable[[WorkerKey], Path],
        running: Callable[[WorkerKey], bool],
    ) -> None:
        self.node_id = node_id
        self.log_path = log_path
        self.running = running  # by launch key: is that process alive

    @classmethod
    def of(cls, supervisor: Supervisor) -> LogServer:
        def running(launch: WorkerKey) -> bool:
            return any(w.key == launch for w in supervisor.live())

        return cls(supervisor.node_id, supervisor.log_path, running)

    async def serve(self, bus: Replier) -> None:
        await bus.serve(logs_subject(self.node_id), self._on_request)

    def regrouped(self, worker: Worker) -> None:
        """The worker now serves as ``worker.current``: requests for that identity must read
        the file it has written since its launch."""
        launch, now_is = self.log_path(worker.key), self.log_path(worker.current)
        if now_is == launch:
            return
        try:
            link(now_is, launch)
        except OSError as exc:
            log.warning(
                "cannot link a regrouped worker's log",
                job_id=worker.key.job_id,
                path=str(now_is),
                error=repr(exc),
            )

    async def _on_request(self, data: bytes) -> bytes:
        try:
            reply = await self.answer(LogsRequest.model_validate_json(data))
        except ValidationError as exc:
            reply = LogsReply(found=False, error=f"invalid logs request: {exc}")
        except Exception as exc:  # the API must hear why, not time out
            log.exception("logs request failed")
            reply = LogsReply(found=False, error=f"the agent could not read the log: {exc!r}")
        return reply.model_dump_json().encode()

    async def answer(self, request: LogsRequest) -> LogsReply:
        if not _SAFE_ID.match(request.job_id):
            return LogsReply(found=False, error=f"job id {request.job_id!r} is not a safe name")
        key = WorkerKey(request.job_id, request.generation, request.rank)
        launch = await asyncio.to_thread(self._launch_key, key)
        # Asked before the read: a process that was gone by then has written everything the
        # read returns, so a reply that reaches the end with running=False is the last one.
        running = self.running(launch)
        chunk = await asyncio.to_thread(
            read_chunk, self.log_path(launch), request.offset, request.tail, request.max_bytes
        )
        if chunk is None:
            return LogsReply(found=running, running=running)
        return LogsReply(
            found=True,
            running=running,
            data=chunk.data,
            offset=chunk.offset,
            next_offset=chunk.offset + len(chunk.data),
            size=chunk.size,
        )

    def _launch_key(self, key: WorkerKey) -> WorkerKey:
        """The launch key of the process that served as ``key`` (itself unless it regrouped)."""
        try:
            target = os.readlink(self.log_path(key))
        except OSError:  # no link: a plain log, or none
            return key
        match = ALIAS.match(target)
        if match is None:
            return key
        return key._replace(generation=int(match[1]), rank=int(match[2]))


def link(alias: Path, target: Path) -> None:
    """Point ``alias`` at ``target`` (same directory), replacing an older link but never a
    real log."""
    if alias.exists() and not alias.is_symlink():
        raise FileExistsError(f"{alias} is a log of its own")
    alias.parent.mkdir(parents=True, exist_ok=True)
    temp = alias.with_name(f".{alias.name}.{os.getpid()}.tmp")
    temp.unlink(missing_ok=True)
    os.symlink(target.name, temp)
    os.replace(temp, alias)


def read_chunk(path: Path, offset: int | None, tail: int | None, max_bytes: int) -> Chunk | None:
    """Up to ``max_bytes`` from ``offset``, or from the start of the last ``tail`` lines (the
    whole file when neither is given); None when there is no such file."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        if offset is not None:
            start = min(offset, size)
        elif tail is not None:
            start = tail_start(f, size, tail)
        else:
            start = 0
        f.seek(start)
        return Chunk(f.read(min(max_bytes, size - start)), start, size)


def tail_start(f: BinaryIO, size: int, lines: int) -> int:
    """Where the last ``lines`` lines begin; a final newline ends a line, it starts none."""
    if lines == 0 or size == 0:
        return size
    f.seek(size - 1)
    end = size - 1 if f.read(1) == b"\n" else size
    floor = max(0, size - TAIL_SCAN_BYTES)
    seen, pos = 0, end
    while pos > floor:
        step = min(BLOCK, pos - floor)
        pos -= step
        f.seek(pos)
        block = f.read(step)
        cut = len(block)
        while (cut := block.rfind(b"\n", 0, cut)) >= 0:
            seen += 1
            if seen == lines:
                return pos + cut + 1
    return floor
