"""What ``/proc`` says of a worker process: its state letter, and how long it waited for a CPU.

Hang detection (:mod:`unicron.services.agent.hang`) reads both. A process stopped by a signal
(``T``) never shows up as an exit. Time spent runnable but waiting on a run queue is not silence: on
a busy node a healthy worker can wait there for most of a second, and counting that time as a
hang restarted healthy jobs (bench/chaos.py on a 2-core machine, load 10 to 15).
"""

from __future__ import annotations

from pathlib import Path


def process_state(pid: int) -> str:
    """The state letter in ``/proc/<pid>/stat`` (R, S, D, T, Z …), or ``?`` when unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return "?"
    # the command name in parentheses may hold spaces and parentheses: split after the last
    rest = stat.rpartition(")")[2].split()
    return rest[0] if rest else "?"


def runqueue_wait_s(pid: int) -> float | None:
    """Seconds the process's main thread (the training loop's) has spent runnable but
    waiting for a CPU since it started, from ``/proc/<pid>/schedstat``; None when unreadable
    (no such process, or a kernel without scheduler statistics)."""
    try:
        fields = Path(f"/proc/{pid}/schedstat").read_text(encoding="ascii").split()
        return int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
