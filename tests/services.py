"""Service processes of a test: ``python -m unicron.services.<name>`` on the test's own NATS
and Redis, each logging to ``<name>-<n>.log`` in the test's directory, all stopped at its end
(and their logs printed, which pytest shows when the test failed)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from unicron.shared.procs import die_with_parent

REPO = Path(__file__).resolve().parents[1]
StartService = Callable[..., subprocess.Popen[bytes]]


@contextmanager
def service_processes(
    name: str, nats_url: str, redis_url: str, tmp_path: Path
) -> Iterator[StartService]:
    """A starter of processes of the service ``name``: keyword arguments become its
    ``UNICRON_*`` settings."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(**settings: str) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "UNICRON_NATS_URL": nats_url,
            "UNICRON_REDIS_URL": redis_url,
            **{f"UNICRON_{k.upper()}": v for k, v in settings.items()},
        }
        with (tmp_path / f"{name}-{len(procs)}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", f"unicron.services.{name}"],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        procs.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for log in sorted(tmp_path.glob(f"{name}-*.log")):
            print(f"--- {log.name}\n{log.read_text()[-4000:]}")
