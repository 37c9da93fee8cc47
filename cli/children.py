"""The stack's child processes: how one is started, and what is said when one died.

A child's output goes to its own log file; when it dies during the start, the error quotes the
log's last lines, so that a CI run or a terminal shows the cause and not only a path to a file
that is gone with the machine.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from unicron.shared.procs import die_with_parent

TAIL_LINES = 20


@dataclass
class Child:
    name: str
    module: str
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    def log_path(self, logs: Path) -> Path:
        return logs / f"{self.name}.log"

    def spawn(self, logs: Path) -> None:
        """Start ``python -m module``, appending its output to its log."""
        with self.log_path(logs).open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )

    def exited(self) -> int | None:
        """Its exit code once it exited, else None."""
        return None if self.process is None else self.process.poll()

    def died(self, logs: Path) -> str:
        """Which child exited, with what code, and the last lines of its log."""
        path = self.log_path(logs)
        assert self.process is not None
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        tail = "\n".join(f"  | {line}" for line in lines[-TAIL_LINES:]) or "  | (its log is empty)"
        return f"{self.name} exited with {self.process.returncode}; its log {path} ends:\n{tail}"
