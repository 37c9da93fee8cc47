"""Local channel between a worker and its node agent: a unix stream socket of JSON lines.

Worker → agent: a ``Hello`` line, then each report model (``StepCompleted``, ``WorkerPhase``,
``WorkerException``, …) as one line of ``model_dump_json()``. Agent → worker: one
``WorkerDirective`` a line (:mod:`unicron.shared.contracts.workerchannel`), parsed here and handed
to a callback; a line that is not a valid directive is logged and dropped.

Training must never wait on the agent (docs/design.md §6), nor pay more than a microsecond a
report for telling it: :meth:`AgentChannel.send` appends the report to a bounded deque (atomic,
no lock, no syscall; a full deque drops its oldest report) and returns. A step's own reports
come as a :class:`Deferred`, the model and its values in a partial, which the writer builds. A
daemon writer thread wakes on a short timer (``batch_s``, 10 ms), serialises everything queued
and writes it in one go; it connects and reconnects on its own. Routine per-step reports
(``StepCompleted``, ``WorkerPhase``, deferred or not) wait for that timer; any other report — a
hello, an exception before death, a regroup — wakes the writer at once, as does
:meth:`AgentChannel.flush`, the one bounded wait, used just before the process exits so that
its last words reach the agent. After a while with nothing to send the writer stops ticking
until the next report wakes it.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol

from unicron.shared.contracts.reports import StepCompleted, WorkerPhase
from unicron.shared.contracts.workerchannel import (
    AnyWorkerDirective,
    DirectiveError,
    parse_directive,
)
from unicron.shared.logging import get_logger

log = get_logger(component="unicron.trainer.channel")

QUEUE_LIMIT = 1024
BATCH_S = 0.01  # how long a routine report may wait for company; the agent's latency budget
_IDLE_AFTER_S = 0.5  # no reports for this long: stop ticking, let the next send wake us
_RECONNECT_MIN_S = 0.02
_RECONNECT_MAX_S = 1.0


class Report(Protocol):
    def model_dump_json(self) -> str: ...


class Deferred(functools.partial[Report]):
    """A routine report that the writer thread builds, ``build(*args)``, and serialises.

    A step's reports are sent right after long stretches of compute, when the training
    thread's caches are cold: there, validating and building a pydantic model costs tens of
    microseconds, while making this partial costs a few. Validation moves to the writer, so
    the model stays the contract and the line is the one the model itself would have written;
    the arguments must hold every value of the report, its ``at`` stamp included, taken when
    it was sent. A report that fails to build is logged and dropped, as one that fails to
    serialise.
    """

    def model_dump_json(self) -> str:
        return self().model_dump_json()


_ROUTINE = frozenset({StepCompleted, WorkerPhase, Deferred})


class AgentChannel:
    """Fire-and-forget reports to the agent at ``path`` and directives back from it."""

    def __init__(
        self,
        path: str,
        on_directive: Callable[[AnyWorkerDirective], None] | None = None,
        queue_limit: int = QUEUE_LIMIT,
        batch_s: float = BATCH_S,
    ) -> None:
        self.path = path
        self.on_directive = on_directive
        self._limit = queue_limit
        self._batch_s = batch_s
        # (sequence number, report): the writer counts the gaps a full deque left as drops.
        self._queue: collections.deque[tuple[int, Report]] = collections.deque(maxlen=queue_limit)
        self._seq = itertools.count()
        self._next_seq = 0  # writer only: the sequence number it expects next
        self._lost = 0  # writer only: dropped once off the deque (or a gap it found)
        self._pending: list[bytes] = []  # serialised lines not yet accepted by the socket
        self._progress = threading.Condition()  # guards _pending; flush waits on it
        self._wake = threading.Event()
        self._idle = False  # the writer has stopped ticking: send must wake it
        self._closed = False
        self._sock: socket.socket | None = None
        self._writer = threading.Thread(target=self._write_loop, name="agent-channel", daemon=True)
        self._writer.start()

    # --- training side -----------------------------------------------------------------

    def send(self, report: Report, urgent: bool | None = None) -> None:
        """Queue ``report`` for the agent; never blocks. ``urgent`` (by default: any report
        that is not a routine step report) makes the writer send it now, not at its next tick.
        """
        if self._closed:
            return
        self._queue.append((next(self._seq), report))
        if urgent or self._idle or (urgent is None and type(report) not in _ROUTINE):
            self._wake.set()

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until every queued report is written; True if they were."""
        deadline = time.monotonic() + timeout_s
        with self._progress:
            while self._queue or self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.set()
                self._progress.wait(left)
        return True

    def close(self) -> None:
        """Stop the threads; reports still queued are discarded (flush first to keep them)."""
        with self._progress:
            self._closed = True
            self._queue.clear()
            self._pending.clear()
            self._progress.notify_all()
            sock, self._sock = self._sock, None
        self._wake.set()
        if sock is not None:
            _shutdown(sock)
        self._writer.join(timeout=2.0)

    @property
    def dropped(self) -> int:
        """Reports lost to a full queue so far (the oldest ones)."""
        try:
            head = self._queue[0][0]
        except IndexError:
            return self._lost
        return self._lost + max(0, head - self._next_seq)

    @property
    def connected(self) -> bool:
        return self._sock is not None

    # --- writer thread -----------------------------------------------------------------

    def _write_loop(self) -> None:
        delay = _RECONNECT_MIN_S
        quiet_since = time.monotonic()
        wait_s: float | None = self._batch_s
        while True:
            self._wake.wait(wait_s)
            self._wake.clear()
            self._idle = False
            wait_s = self._batch_s
            if self._closed:
                return
            if not self._queue and not self._pending:
                if time.monotonic() - quiet_since > _IDLE_AFTER_S:
                    self._idle = True
                    # Set before this last look, so a report appended after it finds it set.
                    wait_s = None if not self._queue else 0.0
                continue
            quiet_since = time.monotonic()
            # Connect before taking reports, so that while the agent is away every report
            # stays in the bounded queue and the newest ones are what survive.
            sock = self._sock or self._connect()
            if sock is None:
                wait_s = delay
                delay = min(delay * 2, _RECONNECT_MAX_S)
                continue
            delay = _RECONNECT_MIN_S
            self._write(sock)

    def _write(self, sock: socket.socket) -> None:
        with self._progress:
            lines = self._collect()
        data = b"".join(lines)
        sent = 0
        try:
            with memoryview(data) as view:
                while sent < len(data):
                    sent += sock.send(view[sent:])
        except OSError:
            # The agent went away mid-write; its reader drops a half line, so each line the
            # socket did not take whole goes again, whole, on the next connection.
            self._drop_connection(sock)
        with self._progress:
            done = 0
            for line in lines:
                if sent < len(line):
                    break
                sent -= len(line)
                done += 1
            del self._pending[:done]
            self._progress.notify_all()

    def _collect(self) -> list[bytes]:
        """Serialise every queued report onto the pending lines, keeping the newest ``limit``."""
        pending, queue = self._pending, self._queue
        while True:
            try:
                seq, report = queue.popleft()
            except IndexError:
                break
            self._lost += max(0, seq - self._next_seq)
            self._next_seq = max(self._next_seq, seq + 1)
            try:
                pending.append(report.model_dump_json().encode() + b"\n")
            except Exception:
                # Not the training thread's exception to get any more: drop the report only.
                log.exception("report could not be serialised", report=repr(report)[:200])
        if len(pending) > self._limit:
            self._lost += len(pending) - self._limit
            del pending[: len(pending) - self._limit]
        return list(pending)

    def _connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            return None
        with self._progress:
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
        with self._progress:
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
            directive = parse_directive(line)
        except DirectiveError as exc:
            log.warning("agent sent a line that is not a directive", error=str(exc)[:500])
            return
        if self.on_directive is not None:
            try:
                self.on_directive(directive)
            except Exception:
                # A bad directive handler must not kill the channel that reports the failure.
                log.exception("directive handler failed", directive=directive.directive)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
