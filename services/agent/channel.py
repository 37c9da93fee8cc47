"""The local channel: a unix socket where this node's workers send their in-band reports.

Each line a worker writes is one JSON ``WorkerReport``; the channel hands it to ``observe``
(hang detection) and forwards it to the bus as it is — except ``WorkerPhase``, which is for
this agent only. A line that does not parse, that speaks for another node or another worker,
or that only the agent may send (started, exited, hung), is dead-lettered and the connection
stays up. The channel keeps each connection's writer, keyed by every (job, generation, rank)
the worker has spoken for — from the process id of the peer (``SO_PEERCRED``), from an
optional ``{"kind": "hello", ...}`` line and from its reports — so the agent can send a
directive to one worker, even after it re-formed in place under a new generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import struct
import time
from pathlib import Path

from pydantic import ValidationError
from unicron.services.agent.api import Advance, Identify, Observe, Report, Sink
from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.reports import (
    WORKER_REPORT,
    WorkerExited,
    WorkerHello,
    WorkerHung,
    WorkerPhase,
    WorkerStarted,
)
from unicron.shared.contracts.workerchannel import AnyWorkerDirective, directive_line
from unicron.shared.logging import get_logger

MAX_LINE = 1 << 20  # a report is a few hundred bytes; anything near this is garbage
SEND_TIMEOUT_S = 1.0
DRAIN_POLL_S = 0.002
# the agent's own reports about a worker; a worker sending one would be forging it
AGENT_ONLY = (WorkerStarted, WorkerExited, WorkerHung)
log = get_logger(component="channel")


class _Conn:
    def __init__(
        self, writer: asyncio.StreamWriter, launched: WorkerKey | None, pid: int | None = None
    ) -> None:
        self.writer = writer
        self.pid = pid  # the peer process, which the agent waits on when it exits
        self.launched = launched  # the worker the supervisor started with this pid, if any
        self.keys: set[WorkerKey] = set()


def peer_pid(writer: asyncio.StreamWriter) -> int | None:
    """The process id at the other end of a unix socket (Linux ``SO_PEERCRED``)."""
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    return int(pid) if pid > 0 else None


class WorkerChannel:
    def __init__(
        self,
        path: Path,
        node_id: str,
        sink: Sink,
        identify: Identify = lambda _pid: None,
        on_generation: Advance = lambda _key, _gen: None,
        observe: Observe = lambda _key, _report: None,
    ) -> None:
        self.path = path
        self.node_id = node_id
        self.sink = sink
        self.identify = identify
        self.on_generation = on_generation
        self.observe = observe
        self._by_key: dict[WorkerKey, _Conn] = {}
        self._conns: set[_Conn] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A socket file left by an earlier agent on this node would make bind fail.
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.path), limit=MAX_LINE
        )
        os.chmod(self.path, 0o600)  # only this user's processes may speak for workers
        log.info("worker channel listening", socket=str(self.path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.writer.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def connected(self, key: WorkerKey) -> bool:
        return key in self._by_key

    async def drained(self, pid: int, within: float) -> None:
        """Return once every connection process ``pid`` made, even one not yet accepted, has
        been read to its end, or after ``within`` seconds (a child it forked may hold one
        open). Awaited when it exited, so its last reports land before its exit report."""
        deadline = time.monotonic() + within
        while self._backlog() or any(c.pid == pid for c in self._conns):
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(DRAIN_POLL_S)

    def _backlog(self) -> bool:
        """Whether a connection waits in the listening socket's queue."""
        if self._server is None or not self._server.sockets:
            return False
        readable, _, _ = select.select([self._server.sockets[0].fileno()], [], [], 0)
        return bool(readable)

    def launched_as(self, key: WorkerKey) -> WorkerKey | None:
        """The launch key of the connected worker that speaks for ``key``, if the agent
        launched it (it may have re-formed in place under another generation or rank)."""
        conn = self._by_key.get(key)
        return None if conn is None else conn.launched

    def adopt(self, old: WorkerKey, new: WorkerKey) -> None:
        """The process that spoke as ``old`` (a spare) is now the worker launched as ``new``."""
        conn = self._by_key.get(old)
        if conn is None:
            return
        conn.launched = new
        self._bind(conn, new)

    async def send_to_worker(self, key: WorkerKey, directive: AnyWorkerDirective) -> bool:
        """Send ``directive`` to the worker that speaks for ``key``; False when it is not
        connected or not reading."""
        conn = self._by_key.get(key)
        if conn is None or conn.writer.is_closing():
            return False
        conn.writer.write(directive_line(directive))
        try:
            await asyncio.wait_for(conn.writer.drain(), SEND_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            return False
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid = peer_pid(writer)
        conn = _Conn(writer, self.identify(pid) if pid is not None else None, pid)
        self._conns.add(conn)
        if conn.launched is not None:
            self._bind(conn, conn.launched)
        try:
            await self._read_lines(reader, conn)
        finally:
            self._forget(conn)
            writer.close()

    async def _read_lines(self, reader: asyncio.StreamReader, conn: _Conn) -> None:
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # over MAX_LINE; asyncio has already discarded it
                self._reject(b"", "line longer than the limit")
                continue
            except ConnectionError:
                return
            if not line:
                return
            if line.strip():
                self._on_line(line.strip(), conn)

    def _on_line(self, line: bytes, conn: _Conn) -> None:
        try:
            report = WORKER_REPORT.validate_json(line)
        except ValidationError as exc:
            hello = self._parse_hello(line)
            if hello is None:
                self._reject(line, f"invalid report: {exc}")
            else:
                self._bind(conn, hello.key)
            return
        problem = self._impostor(report, conn)
        if problem is not None:
            self._reject(line, problem)
            return
        self._bind(conn, report.key)
        self.observe(conn.launched, report)
        if not isinstance(report, WorkerPhase):
            self.sink.report(report)

    @staticmethod
    def _parse_hello(line: bytes) -> WorkerHello | None:
        try:
            return WorkerHello.model_validate_json(line)
        except ValidationError:
            return None

    def _impostor(self, report: Report, conn: _Conn) -> str | None:
        """Why the report must not be forwarded as it is, or None when it may."""
        if isinstance(report, AGENT_ONLY):
            return f"{report.kind} is the agent's to report, not a worker's"
        if report.node_id != self.node_id:
            return f"report for node {report.node_id!r} sent to {self.node_id!r}"
        launched = conn.launched
        if launched is not None and report.job_id != launched.job_id:
            return f"worker of {launched.job_id} reported for {report.job_id}"
        return None

    def _bind(self, conn: _Conn, key: WorkerKey) -> None:
        if key in conn.keys:
            return
        conn.keys.add(key)
        self._by_key[key] = conn  # the newest connection for a key wins (a restarted worker)
        if conn.launched is not None and key.generation > conn.launched.generation:
            self.on_generation(conn.launched, key.generation)

    def _forget(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        for key in conn.keys:
            if self._by_key.get(key) is conn:
                del self._by_key[key]

    def _reject(self, line: bytes, reason: str) -> None:
        log.warning("worker line rejected", reason=reason[:200])
        self.sink.dead_letter(f"agent.{self.node_id}.channel", line, reason)
