"""Stand-ins for what surrounds a worker: the agent's socket, its TCP store, the launch."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import socket
import struct
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
from unicron.shared.contracts.messages import Rendezvous
from unicron.shared.contracts.models import JobSpec, ModelConfig
from unicron.shared.contracts.workerchannel import WorkerEnv, WorkerLaunch, env_name
from unicron.shared.procs import die_with_parent, free_port

REPO = Path(__file__).resolve().parents[2]

TINY = ModelConfig(n_layer=1, n_head=2, d_model=32, seq_len=16, vocab=64)


# Lines a real agent keeps to itself instead of forwarding: who a worker is, and its phases.
LOCAL_KINDS = ("hello", "worker_phase")
# Put on ``local`` by the stand-in when a worker's connection ends: all its lines are in.
DISCONNECTED = "disconnected"


class AgentStandIn:
    """A unix-socket server that plays the agent's side of the local channel.

    Reports the agent would forward arrive on ``lines``; hellos, phases and the stand-in's own
    ``{"kind": "disconnected", "rank": r}`` when a worker's connection ends, on ``local``.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.local: queue.Queue[dict[str, Any]] = queue.Queue()
        self.connections: queue.Queue[socket.socket] = queue.Queue()
        self._by_rank: dict[int, socket.socket] = {}
        # Like a real agent, tell processes apart by the peer pid of their connection: a spare
        # and a regrouped worker keep their pid, not their rank.
        self._by_pid: dict[int, socket.socket] = {}
        self._hello = threading.Condition()
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
        rank = None
        pid = peer_pid(conn)
        with conn.makefile("rb") as stream:
            for line in stream:
                message = json.loads(line)
                local = isinstance(message, dict) and message.get("kind") in LOCAL_KINDS
                (self.local if local else self.lines).put(message)
                if local and message["kind"] == "hello":
                    rank = message["rank"]
                    with self._hello:
                        self._by_rank[rank] = conn
                        self._by_pid[pid] = conn
                        self._hello.notify_all()
        with self._hello:
            if self._by_pid.get(pid) is conn:
                del self._by_pid[pid]
        self.local.put({"kind": DISCONNECTED, "rank": rank, "pid": pid})

    def next(self, timeout_s: float = 20.0) -> dict[str, Any]:
        return self.lines.get(timeout=timeout_s)

    def collect(
        self,
        done: Callable[[list[dict[str, Any]]], bool],
        timeout_s: float = 30.0,
        local: bool = False,
    ) -> list[dict[str, Any]]:
        """Reports (hellos and phases with ``local``) received until ``done(received)``
        holds; fails the test on timeout."""
        source = self.local if local else self.lines
        received: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while not done(received):
            left = deadline - time.monotonic()
            try:
                received.append(source.get(timeout=max(left, 0.001)))
            except queue.Empty:
                raise AssertionError(f"timed out; got {received}") from None
        return received

    def send(self, line: bytes | dict[str, Any], rank: int = 0, timeout_s: float = 30.0) -> None:
        """Write one line to the worker of ``rank``, waiting for its hello if need be."""
        self._send(line, self._by_rank, rank, f"rank {rank}", timeout_s)

    def send_to_pid(self, line: bytes | dict[str, Any], pid: int, timeout_s: float = 30.0) -> None:
        """Write one line to the process ``pid``, waiting for its hello if need be."""
        self._send(line, self._by_pid, pid, f"pid {pid}", timeout_s)

    def _send(
        self,
        line: bytes | dict[str, Any],
        conns: dict[int, socket.socket],
        key: int,
        who: str,
        timeout_s: float,
    ) -> None:
        with self._hello:
            if not self._hello.wait_for(lambda: key in conns, timeout_s):
                raise AssertionError(f"no hello from {who}")
            conn = conns[key]
        data = line if isinstance(line, bytes) else json.dumps(line).encode()
        conn.sendall(data.rstrip(b"\n") + b"\n")

    def close(self) -> None:
        """Go away like a dead agent: the listener and every connection end."""
        self._server.close()
        while not self.connections.empty():
            conn = self.connections.get()
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


def peer_pid(conn: socket.socket) -> int:
    """The pid of the process at the other end of a unix socket (Linux SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid: int = struct.unpack("3i", creds)[0]
    return pid


class StoreHost:
    """The rendezvous TCP store, hosted by the test. Workers wait (retrying) until it is up,
    so a test that holds it back knows they have not started training yet."""

    def __init__(self) -> None:
        self.port = free_port()
        self._store: TCPStore | None = None

    def start(self) -> None:
        timeout = timedelta(seconds=30)
        self._store = TCPStore(
            "127.0.0.1", self.port, is_master=True, wait_for_workers=False, timeout=timeout
        )

    def stop(self) -> None:
        self._store = None  # the server thread ends with the last reference


@contextmanager
def agent_and_held_store() -> Iterator[tuple[AgentStandIn, Rendezvous, Path, StoreHost]]:
    """An agent socket, a TCP store not started yet, and a short scratch directory."""
    # AF_UNIX paths are limited to ~100 bytes; pytest's tmp_path can be longer.
    scratch = Path(tempfile.mkdtemp(prefix="unicron-", dir="/tmp"))
    agent = AgentStandIn(str(scratch / "agent.sock"))
    store = StoreHost()
    try:
        yield (
            agent,
            Rendezvous(host="127.0.0.1", port=store.port, prefix="job-t/gen-1/"),
            scratch,
            store,
        )
    finally:
        agent.close()
        store.stop()
        shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def agent_and_store() -> Iterator[tuple[AgentStandIn, Rendezvous, Path]]:
    """An agent socket, a TCP store hosted here, and a short scratch directory."""
    with agent_and_held_store() as (agent, rendezvous, scratch, store):
        store.start()
        yield agent, rendezvous, scratch


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
    launch: WorkerLaunch | None, module: str = "unicron.trainer.worker", **extra_env: str
) -> subprocess.Popen[bytes]:
    """Start a worker the way an agent does: a fresh interpreter with the launch in its env."""
    env = {k: v for k, v in os.environ.items() if k != env_name("launch")}
    env.update(extra_env)
    if launch is not None:
        env.update(WorkerEnv(launch=launch).to_environ())
    return subprocess.Popen(
        [sys.executable, "-m", module],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=die_with_parent,
    )
