"""Stand-ins for what surrounds a worker: the agent's socket, its TCP store, the launch."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from torch.distributed import TCPStore  # type: ignore[attr-defined]

from shared.messages import Rendezvous, WorkerLaunch
from shared.models import JobSpec, ModelConfig
from shared.procs import die_with_parent, free_port
from trainer.worker import launch_env

REPO = Path(__file__).resolve().parents[2]

TINY = ModelConfig(n_layer=1, n_head=2, d_model=32, seq_len=16, vocab=64)


class AgentStandIn:
    """A unix-socket server that plays the agent's side of the local channel."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.connections: queue.Queue[socket.socket] = queue.Queue()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.connections.put(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn.makefile("rb") as stream:
            for line in stream:
                self.lines.put(json.loads(line))

    def next(self, timeout_s: float = 20.0) -> dict[str, Any]:
        return self.lines.get(timeout=timeout_s)

    def collect(
        self, done: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 30.0
    ) -> list[dict[str, Any]]:
        """Reports received until ``done(reports)`` holds; fails the test on timeout."""
        reports: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while not done(reports):
            left = deadline - time.monotonic()
            try:
                reports.append(self.lines.get(timeout=max(left, 0.001)))
            except queue.Empty:
                raise AssertionError(f"timed out; got {reports}") from None
        return reports

    def close(self) -> None:
        """Go away like a dead agent: the listener and every connection end."""
        self._server.close()
        while not self.connections.empty():
            conn = self.connections.get()
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


@contextmanager
def agent_and_store() -> Iterator[tuple[AgentStandIn, Rendezvous, Path]]:
    """An agent socket, a TCP store hosted here, and a short scratch directory."""
    # AF_UNIX paths are limited to ~100 bytes; pytest's tmp_path can be longer.
    scratch = Path(tempfile.mkdtemp(prefix="unicron-", dir="/tmp"))
    agent = AgentStandIn(str(scratch / "agent.sock"))
    port = free_port()
    store = TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    try:
        yield agent, Rendezvous(host="127.0.0.1", port=port, prefix="job-t/gen-1/"), scratch
    finally:
        agent.close()
        del store
        shutil.rmtree(scratch, ignore_errors=True)


def make_spec(**overrides: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "name": "t",
        "steps": 4,
        "global_batch": 8,
        "micro_batch": 2,
        "checkpoint_every": 2,
        "model": TINY,
        "seed": 7,
    }
    fields.update(overrides)
    return JobSpec(**fields)


def make_launch(
    spec: JobSpec,
    rendezvous: Rendezvous,
    agent: AgentStandIn,
    checkpoint_dir: Path,
    rank: int = 0,
    world_size: int = 1,
) -> WorkerLaunch:
    return WorkerLaunch(
        node_id="node-a",
        job_id="job-t",
        generation=1,
        rank=rank,
        world_size=world_size,
        spec=spec,
        rendezvous=rendezvous,
        checkpoint_dir=str(checkpoint_dir),
        agent_socket=agent.path,
    )


def next_generation(launch: WorkerLaunch, generation: int) -> WorkerLaunch:
    """The same rank relaunched as ``generation``, meeting its peers under a fresh prefix."""
    rendezvous = launch.rendezvous.model_copy(update={"prefix": f"job-t/gen-{generation}/"})
    return launch.model_copy(update={"generation": generation, "rendezvous": rendezvous})


def spawn(
    launch: WorkerLaunch | None, module: str = "trainer.worker", **extra_env: str
) -> subprocess.Popen[bytes]:
    """Start a worker the way an agent does: a fresh interpreter with the launch in its env."""
    env = {k: v for k, v in os.environ.items() if k != "UNICRON_WORKER_LAUNCH"}
    env.update(extra_env)
    if launch is not None:
        env.update(launch_env(launch))
    return subprocess.Popen(
        [sys.executable, "-m", module],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=die_with_parent,
    )
