"""Local channel between a worker and its node agent: a unix stream socket of JSON lines.

Worker → agent: a ``Hello`` line, then each report model (``StepCompleted``, ``WorkerPhase``,
``WorkerException``, …) as one line of ``model_dump_json()``. Agent → worker: JSON objects,
one per line, handed to a callback (fault directives and whatever else the agent will say).

Training must never wait on the agent (DESIGN.md §6), so :meth:`AgentChannel.send` only puts
the report on a bounded queue; a daemon thread connects, reconnects and writes. When the queue
is full the oldest report is dropped. :meth:`AgentChannel.flush` is the one bounded wait, used
just before the process exits so that its last words reach the agent.
"""

from __future__ import annotations

import collections
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from unicron.shared.logging import get_logger

log = get_logger(component="trainer.channel")

QUEUE_LIMIT = 1024
_RECONNECT_MIN_S = 0.02
_RECONNECT_MAX_S = 1.0

Directive = dict[str, Any]


class Report(Protocol):
    def model_dump_json(self) -> str: ...


class AgentChannel:
    """Fire-and-forget reports to the agent at ``path`` and directives back from it."""

    def __init__(
        self,
        path: str,
        on_directive: Callable[[Directive], None] | None = None,
        queue_limit: int = QUEUE_LIMIT,
    ) -> None:
        self.path = path
        self.on_directive = on_directive
        self.dropped = 0
        self._queue: collections.deque[bytes] = collections.deque()
        self._limit = queue_limit
        self._in_flight = 0  # a line taken off the queue but not yet written
        self._cond = threading.Condition()
        self._closed = False
        self._sock: socket.socket | None = None
        self._writer = threading.Thread(target=self._write_loop, name="agent-channel", daemon=True)
        self._writer.start()

    # --- training side -----------------------------------------------------------------

    def send(self, report: Report) -> None:
        """Queue ``report`` for the agent; never blocks."""
        line = (report.model_dump_json() + "\n").encode()
        with self._cond:
            if self._closed:
                return
            if len(self._queue) >= self._limit:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(line)
            self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until every queued report is written; True if they were."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """Stop the threads; reports still queued are discarded (flush first to keep them)."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
            sock, self._sock = self._sock, None
        if sock is not None:
            _shutdown(sock)
        self._writer.join(timeout=2.0)

    @property
    def connected(self) -> bool:
        return self._sock is not None

    # --- writer thread -----------------------------------------------------------------

    def _write_loop(self) -> None:
        delay = _RECONNECT_MIN_S
        while self._wait_for_work():
            # Connect before taking a line, so that while the agent is away every report
            # stays in the bounded queue and the newest ones are what survive.
            sock = self._sock or self._connect()
            if sock is None:
                with self._cond:
                    self._cond.wait_for(lambda: self._closed, timeout=delay)
                delay = min(delay * 2, _RECONNECT_MAX_S)
                continue
            delay = _RECONNECT_MIN_S
            line = self._take()
            if line is None:
                continue
            try:
                sock.sendall(line)
                sent = True
            except OSError:
                # The agent went away mid-write; its reader drops a half line, so the whole
                # line goes again on the next connection.
                self._drop_connection(sock)
                sent = False
            self._finish(line, sent)

    def _wait_for_work(self) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._queue or self._closed)
            return not self._closed

    def _take(self) -> bytes | None:
        with self._cond:
            if not self._queue:
                return None
            self._in_flight = 1
            return self._queue.popleft()

    def _finish(self, line: bytes, sent: bool) -> None:
        with self._cond:
            self._in_flight = 0
            if not sent and not self._closed:
                if len(self._queue) < self._limit:
                    self._queue.appendleft(line)
                else:
                    self.dropped += 1  # it is the oldest report, the one a full queue drops
            self._cond.notify_all()

    def _connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            return None
        with self._cond:
            if self._closed:
                sock.close()
                return None
            self._sock = sock
        reader = threading.Thread(
            target=self._read_loop, args=(sock,), name="agent-channel-reader", daemon=True
        )
        reader.start()
        return sock

    def _drop_connection(self, sock: socket.socket) -> None:
        with self._cond:
            if self._sock is sock:
                self._sock = None
        _shutdown(sock)

    # --- reader thread (one per connection) --------------------------------------------

    def _read_loop(self, sock: socket.socket) -> None:
        buffer = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                self._drop_connection(sock)
                return
            *lines, buffer = (buffer + chunk).split(b"\n")
            for line in lines:
                self._deliver(line)

    def _deliver(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            directive = json.loads(line)
        except ValueError:
            log.warning("agent sent a line that is not JSON", line=line[:200])
            return
        if not isinstance(directive, dict):
            log.warning("agent sent JSON that is not an object", line=line[:200])
            return
        if self.on_directive is not None:
            try:
                self.on_directive(directive)
            except Exception:
                # A bad directive handler must not kill the channel that reports the failure.
                log.exception("directive handler failed", directive=directive)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
