"""The orchestrator's view of one child process: started in its own session as
``python -m bench.gpuprobe.worker``, its event lines read as they come, waited on with
timeouts, SIGKILLed, and summed up as a record (exit, events, stderr's tail)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.gpuprobe.common import EVENT_PREFIX, PROBE_ENV, STDERR_TAIL, Record, signal_name

# The folder that holds ``bench/``: the child's working folder, so that ``-m`` finds the package.
REPO_ROOT = Path(__file__).resolve().parents[2]


class Child:
    """One subprocess of this probe in a child role, its events read as they come."""

    def __init__(self, name: str, role: str, cfg: Record, env: dict[str, str], logs: Path):
        self.name = name
        self.role = role
        self.env_set = {
            k: v for k, v in env.items() if k in PROBE_ENV or k.startswith(("NCCL", "TORCH_NCCL"))
        }
        self.stderr_path = logs / f"{name}.stderr"
        self.events: list[Record] = []
        self.lines: list[str] = []
        self.exit_t: float | None = None
        self.killed_t: float | None = None
        self._cond = threading.Condition()
        command = [sys.executable, "-u", "-m", "bench.gpuprobe.worker"]
        command += ["--child", role, "--cfg", json.dumps(cfg)]
        with self.stderr_path.open("wb") as stderr:
            self.spawn_t = time.monotonic()
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=env,
                cwd=REPO_ROOT,
                start_new_session=True,
                text=True,
                bufsize=1,
                errors="replace",
            )
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._wait, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                if line.startswith(EVENT_PREFIX):
                    try:
                        self.events.append(json.loads(line[len(EVENT_PREFIX) :]))
                    except json.JSONDecodeError:
                        self.lines.append(line.rstrip("\n"))
                else:
                    self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def _wait(self) -> None:
        self.proc.wait()
        with self._cond:
            self.exit_t = time.monotonic()
            self._cond.notify_all()

    def event(self, *names: str) -> Record | None:
        """The first event named so, if it has come."""
        with self._cond:
            return next((e for e in self.events if e["event"] in names), None)

    def wait_event(self, *names: str, timeout: float) -> Record | None:
        """The first event named so, waiting up to ``timeout``; None if it exits without one."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while True:
                found = next((e for e in self.events if e["event"] in names), None)
                left = deadline - time.monotonic()
                if found is not None or left <= 0:
                    return found
                if self.exit_t is not None and time.monotonic() - self.exit_t > 0.5:
                    return None  # exited; the last events have been read by now
                self._cond.wait(min(left, 0.05))

    def wait_exit(self, timeout: float) -> bool:
        """Whether it exited within ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: self.exit_t is not None, max(0.0, timeout))

    def send(self, line: str) -> None:
        """One line on its stdin; a child already gone is no error."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def kill(self) -> float:
        """SIGKILL its process group (if it is still running); the moment of the kill."""
        moment = time.monotonic()
        if self.exit_t is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            if self.killed_t is None:
                self.killed_t = moment
        return moment

    def after(self, name: str, origin: float) -> float | None:
        """Seconds from ``origin`` to the event named so, if it came."""
        found = self.event(name)
        return None if found is None else round(found["t"] - origin, 4)

    def summary(self) -> Record:
        """Everything recorded about this child, for the JSON."""
        stderr = ""
        with contextlib.suppress(OSError):
            stderr = self.stderr_path.read_text(errors="replace")
        with self._cond:
            events = [{**e, "since_spawn_s": round(e["t"] - self.spawn_t, 4)} for e in self.events]
            lines = list(self.lines)
        return {
            "name": self.name,
            "role": self.role,
            "pid": self.proc.pid,
            "env": self.env_set,
            "returncode": self.proc.returncode,
            "exit": signal_name(self.proc.returncode),
            "killed_by_probe": self.killed_t is not None,
            "lived_s": None if self.exit_t is None else round(self.exit_t - self.spawn_t, 4),
            "events": events,
            "stdout_other": lines[-80:],
            "stderr_tail": stderr[-STDERR_TAIL:],
            "stderr_chars": len(stderr),
        }


def between(child: Child, first: str, second: str) -> float | None:
    """Seconds between two of a child's events, if both came."""
    a, b = child.event(first), child.event(second)
    return None if a is None or b is None else round(b["t"] - a["t"], 4)
