"""The orchestrator's state and plumbing: the time budget, each child's environment, spawning
children, the TCPStore servers it owns (the agent's role) and reaping a scenario's children.
The scenarios (one module per group) drive it; ``__main__`` runs them in order."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.gpuprobe.common import PROBE_ENV, Record
from bench.gpuprobe.harness import Child


class Probe:
    """One run of the probe: its settings, its facts (the JSON) and its live children."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.device: str = args.device
        self.backend = "nccl" if self.device == "cuda" else "gloo"
        self.out = Path(args.out)
        self.logs = Path(tempfile.mkdtemp(prefix="gpu_probe_"))
        self.deadline: float = time.monotonic() + args.budget_s
        self.pg_timeout_s: float = args.pg_timeout_s
        self.s2_wait_s: float = args.s2_wait_s
        self.extra_env = dict(kv.split("=", 1) for kv in args.env.split(",") if kv)
        self.only: set[str] | None = set(args.only.split(",")) if args.only else None
        self.children: list[Child] = []
        self.servers: list[Any] = []  # this scenario's TCPStore servers, kept alive until reap
        self.facts: Record = {
            "probe": "bench/gpuprobe",
            "argv": sys.argv,
            "extra_env": self.extra_env,
            "device": self.device,
            "backend": self.backend,
            "started_unix": time.time(),
            "host": {
                "platform": platform.platform(),
                "release": platform.release(),
                "python": sys.version,
                "cpus": os.cpu_count(),
            },
            "scenarios": {},
        }
        with contextlib.suppress(OSError):
            self.facts["host"]["proc_version"] = Path("/proc/version").read_text().strip()
        self.results: dict[str, Record] = self.facts["scenarios"]
        self.abort_apis_working: list[str] = []

    def left(self) -> float:
        """Seconds left of the whole probe's budget."""
        return self.deadline - time.monotonic()

    def env(self, **values: str | None) -> dict[str, str]:
        """A child's environment: this one's without PROBE_ENV, loopback networking, ``--env``,
        then ``values`` (None removes a variable)."""
        env = {k: v for k, v in os.environ.items() if k not in PROBE_ENV}
        env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        if self.device == "cuda":
            # Loopback only: this machine has no other network; IB probing only costs time.
            env.update(NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1", NCCL_DEBUG="WARN")
        else:
            env.update(GLOO_SOCKET_IFNAME="lo")
        env.update(self.extra_env)
        for key, value in values.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def spawn(self, name: str, role: str, cfg: Record, env: dict[str, str]) -> Child:
        """A child in ``role``, told the device and backend on top of ``cfg``."""
        full = {"device": self.device, "backend": self.backend, **cfg}
        child = Child(name, role, full, env, self.logs)
        self.children.append(child)
        return child

    def solo(self, name: str, role: str, wait_s: float) -> Child:
        """A lone child in ``role``, waited on until it exits (``wait_s`` at most)."""
        child = self.spawn(name, role, {}, self.env())
        child.wait_exit(min(wait_s, self.left()))
        return child

    def store(self) -> tuple[Any, int]:
        """A TCPStore server owned by the orchestrator (the agent's role): it outlives ranks."""
        import torch.distributed as dist

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        server = dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1", port, None, True, timedelta(seconds=300), wait_for_workers=False
        )
        self.servers.append(server)
        return server, port

    def member_cfg(self, scenario: str, rank: int, **extra: Any) -> Record:
        """A ``member`` rank's settings: one of two, generation 0, looping unless told not to."""
        cfg: Record = {"rank": rank, "world": 2, "prefix": f"{scenario}/gen0"}
        cfg.update(pg_timeout_s=self.pg_timeout_s, mode="loop")
        cfg.update(extra)
        return cfg

    def reap(self) -> list[Record]:
        """Kill what is left of this scenario's children; their records."""
        for child in self.children:
            if child.exit_t is None and child.event("finished") is not None:
                child.wait_exit(2)  # it is on its way out: let it exit on its own
        for child in self.children:
            if child.exit_t is None:
                child.kill()
        for child in self.children:
            child.wait_exit(5)
        records = [child.summary() for child in self.children]
        self.children = []
        self.servers = []
        return records
