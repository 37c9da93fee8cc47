"""What both sides of the probe share: the record type, the constants, the event line a child
writes and the orchestrator reads, an exception's description, and the ways a child exits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, NoReturn

Record = dict[str, Any]

EVENT_PREFIX = "@@probe "
MODEL_NUMEL = 1 << 22  # the survivor's "model": 4 Mi floats that must outlive every failure
BUF_NUMEL = 1 << 20  # the collective's buffer
READY_ITERS = 20  # all_reduces both ranks complete before the peer is killed
STDERR_TAIL = 12000  # characters of a child's stderr kept in the record
ABORT_APIS = ("backend.abort", "c10d._abort_process_group", "pg.abort", "backend.shutdown")
# Variables this probe sets per scenario; whatever the caller's environment has is dropped.
PROBE_ENV = (
    "NCCL_HOSTID",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_USE_COMM_NONBLOCKING",
    "TORCH_NCCL_BLOCKING_WAIT",
)

_EMIT_LOCK = threading.Lock()


@dataclass
class Phase:
    """Where a child is in its work, named in the ``raised`` event if that work fails."""

    name: str


def emit(event: str, **fields: Any) -> None:
    """One event line on stdout for the orchestrator; ``t`` is this machine's monotonic clock."""
    record: Record = {"event": event, "t": time.monotonic(), **fields}
    line = EVENT_PREFIX + json.dumps(record, default=str) + "\n"
    with _EMIT_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


def describe(exc: BaseException) -> Record:
    """An exception's type and full text, and those it was raised from or during."""
    chain: list[Record] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 6:
        kind = type(current)
        chain.append({"type": f"{kind.__module__}.{kind.__qualname__}", "text": str(current)})
        current = current.__cause__ or current.__context__
    return {"type": chain[0]["type"], "text": chain[0]["text"], "chain": chain[1:]}


def exit_now(code: int) -> NoReturn:
    """Leave at once. os._exit: a process group with a dead peer can hang in its destructor at
    interpreter exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def finish() -> NoReturn:
    """A child's last event, then its exit."""
    emit("finished")
    exit_now(0)


def signal_name(returncode: int | None) -> str | None:
    """A return code as words: ``exit N`` or ``killed by SIGNAME``."""
    if returncode is None:
        return None
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exit {returncode}"


def fmt(seconds: Any) -> str:
    """Seconds with four decimals, or whatever else was recorded as it is."""
    return f"{seconds:.4f}" if isinstance(seconds, float | int) else str(seconds)
