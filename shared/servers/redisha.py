"""A Redis that survives losing its primary: a primary, a replica and three Sentinels, embedded
for ``unicron up --ha`` and the tests (docs/design.md §6).

Clients find the primary through the Sentinels (:mod:`unicron.shared.store.sentinel`); when it dies,
the Sentinels agree (2 of 3) and promote the replica within about two seconds. A data server that
died is started again as a replica of whichever server the Sentinels name primary: never as a
second primary, and never before the Sentinels promoted the other one, since a primary back
from its append-only file (fsynced once a second) lacks writes its replica already confirmed.

With logins, the servers admit the services' ACL users plus one more, ``unicron-ha``, with only
what replication and the Sentinels need; its password and the Sentinels' configurations stay in
0700 directories. The Sentinels themselves listen on loopback only and ask for no login.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis
import redis.exceptions
from unicron.shared.contracts.roles import ServiceUser
from unicron.shared.procs import free_port
from unicron.shared.servers.credentials import kept_secret, write_private
from unicron.shared.servers.embedded import (
    EmbeddedServer,
    EmbeddedServerError,
    RestartDeferred,
    redis_server_binary,
    spawn_server,
    start_redis,
)

MASTER_NAME = "unicron"
HA_USER = "unicron-ha"
DOWN_AFTER_MS = 1000  # a primary silent this long is down (loopback: no slow links to forgive)
FAILOVER_TIMEOUT_MS = 10_000
PROMOTION_WAIT_S = 15.0  # a dead primary waits this long for the Sentinels to replace it
# What replication (PSYNC) and a Sentinel (monitoring, failover) need, and nothing else.
_HA_RIGHTS = (
    "resetchannels &__sentinel__:hello -@all +psync +replconf +ping +multi +slaveof +exec "
    "+subscribe +config|rewrite +role +publish +info +client|setname +client|kill +script|kill"
)


def _replicaof(cmd: list[str], primary: int | None) -> list[str]:
    """``cmd`` with its ``--replicaof`` replaced: of ``primary``, or none (a primary)."""
    if "--replicaof" in cmd:
        at = cmd.index("--replicaof")
        cmd = cmd[:at] + cmd[at + 3 :]
    target = ["no", "one"] if primary is None else ["127.0.0.1", str(primary)]
    return [*cmd, "--replicaof", *target]


def _fields(answer: dict[str, str] | list[str]) -> dict[str, str]:
    """A Sentinel's answer about a server: a map, or [field, value, ...] as RESP2 has it."""
    if isinstance(answer, dict):
        return answer
    return dict(zip(answer[::2], answer[1::2], strict=True))


@dataclass
class RedisHa:
    data: list[EmbeddedServer]  # the primary and its replica, in the order they started
    sentinels: list[EmbeddedServer]
    master: str = MASTER_NAME
    _deferred_since: dict[str, float] = field(default_factory=dict)

    @property
    def servers(self) -> list[EmbeddedServer]:
        return [*self.data, *self.sentinels]

    @property
    def sentinels_setting(self) -> str:
        """The ``UNICRON_REDIS_SENTINELS`` that names these Sentinels."""
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    @property
    def login_url(self) -> str:
        """The URL the services' logins are written into; its host is only a first guess (a
        client asks the Sentinels), its user, password and database are what counts."""
        return self.data[0].url

    def _ask(self, *command: str) -> object:
        """A command to the first Sentinel that answers; None when none does."""
        for sentinel in self.sentinels:
            client = redis.Redis(port=sentinel.port, socket_timeout=0.5, decode_responses=True)
            try:
                return client.execute_command(*command)  # type: ignore[no-untyped-call]
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                continue
            finally:
                client.close()
        return None

    def master_port(self) -> int | None:
        """The port of the server the Sentinels name primary; None when no Sentinel answers."""
        answer = self._ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master)
        return int(answer[1]) if isinstance(answer, list) and len(answer) == 2 else None

    def primary(self) -> EmbeddedServer | None:
        port = self.master_port()
        return next((s for s in self.data if s.port == port), None)

    def failover(self) -> None:
        """Ask the Sentinels to promote the replica now (a planned switch, or a drill)."""
        if self._ask("SENTINEL", "FAILOVER", self.master) is None:
            raise EmbeddedServerError("no Sentinel answered SENTINEL FAILOVER")

    def wait_promoted(self, old_port: int, timeout_s: float = 30.0) -> int:
        """Wait until the Sentinels name a primary other than ``old_port``; returns its port."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            port = self.master_port()
            if port is not None and port != old_port:
                return port
            time.sleep(0.1)
        raise EmbeddedServerError(f"no replica promoted in place of {old_port} in {timeout_s}s")

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Wait until every Sentinel knows the replica and the other Sentinels: before that, a
        failover could find no replica to promote, or no majority to allow it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._sentinel_ready(s.port) for s in self.sentinels):
                return
            time.sleep(0.1)
        raise EmbeddedServerError(f"the Sentinels did not see each other in {timeout_s}s")

    def _sentinel_ready(self, port: int) -> bool:
        client = redis.Redis(port=port, socket_timeout=0.5, decode_responses=True)
        try:
            ask = client.execute_command
            replicas = ask("SENTINEL", "REPLICAS", self.master)  # type: ignore[no-untyped-call]
            peers = ask("SENTINEL", "SENTINELS", self.master)  # type: ignore[no-untyped-call]
        except redis.exceptions.RedisError:
            return False
        finally:
            client.close()
        synced = [r for r in replicas if _fields(r).get("master-link-status") == "ok"]
        return len(synced) >= len(self.data) - 1 and len(peers) >= len(self.sentinels) - 1

    def rejoin(self, server: EmbeddedServer) -> None:
        """``prepare`` for a data server's restart: come back as the primary's replica."""
        primary = self.master_port()
        if primary is None or primary != server.port:
            self._deferred_since.pop(server.name, None)
            if primary is not None:
                server.cmd = _replicaof(server.cmd, primary)
            return
        since = self._deferred_since.setdefault(server.name, time.monotonic())
        if time.monotonic() - since < PROMOTION_WAIT_S:
            raise RestartDeferred(f"{server.name}: waiting for the Sentinels to promote")
        # No replica to promote (it is gone too): this one's file is the best there is.
        self._deferred_since.pop(server.name, None)
        server.cmd = _replicaof(server.cmd, None)

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()


def _sentinel_conf(port: int, workdir: Path, primary: int, secret: str | None) -> str:
    lines = [
        f"port {port}",
        "bind 127.0.0.1",
        f"dir {workdir}",
        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2",
        f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
        f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
        f"sentinel parallel-syncs {MASTER_NAME} 1",
    ]
    if secret is not None:
        lines += [
            f"sentinel auth-user {MASTER_NAME} {HA_USER}",
            f"sentinel auth-pass {MASTER_NAME} {secret}",
        ]
    return "\n".join(lines) + "\n"


def _start_sentinel(workdir: Path, index: int, primary: int, secret: str | None) -> EmbeddedServer:
    port = free_port()
    home = workdir / f"sentinel-{index}"
    conf = home / "sentinel.conf"  # rewritten by the Sentinel itself as it learns
    write_private(conf, _sentinel_conf(port, home, primary, secret))
    cmd = [redis_server_binary(), str(conf), "--sentinel"]
    url = f"redis://127.0.0.1:{port}"
    return spawn_server(f"sentinel-{index}", cmd, port, url, home / "sentinel.log")


def _start_data(
    workdir: Path,
    index: int,
    logins: Sequence[tuple[ServiceUser, str]],
    secret: str | None,
    primary: int | None,
) -> EmbeddedServer:
    home = workdir / f"data-{index}"
    config = home / "ha.conf"  # Sentinel's CONFIG REWRITE needs a file; 0600, in a 0700 dir
    auth = f"masteruser {HA_USER}\nmasterauth {secret}\n" if secret else ""
    write_private(config, auth)
    extra_acl = ""
    if secret is not None:
        digest = hashlib.sha256(secret.encode()).hexdigest()
        extra_acl = f"user {HA_USER} on #{digest} {_HA_RIGHTS}\n"
    # A replica syncs at once: by default a primary waits 5 s for more replicas to sync with.
    extra_args = ["--repl-diskless-sync-delay", "0", *_replicaof([], primary)]
    return start_redis(
        home, logins=logins, extra_args=extra_args, extra_acl=extra_acl,
        name=f"redis-{index}", config_file=config,
    )  # fmt: skip


def start_redis_ha(
    workdir: Path, logins: Sequence[tuple[ServiceUser, str]] = (), sentinels: int = 3
) -> RedisHa:
    """A primary and a replica, each with its append-only file in ``workdir/data-<i>``, and
    ``sentinels`` Sentinels watching them; returns once a failover could happen. With
    ``logins``, only those users (and replication's own) may log in (shared/store/redisauth.py)."""
    secret = kept_secret(workdir / "ha.secret") if logins else None
    started: list[EmbeddedServer] = []
    try:
        started.append(_start_data(workdir, 0, logins, secret, None))
        started.append(_start_data(workdir, 1, logins, secret, started[0].port))
        for index in range(sentinels):
            started.append(_start_sentinel(workdir, index, started[0].port, secret))
    except BaseException:
        for server in reversed(started):
            server.stop()
        raise
    ha = RedisHa(data=started[:2], sentinels=started[2:])
    for server in ha.data:
        server.prepare = ha.rejoin
    try:
        ha.wait_ready()
    except BaseException:
        ha.stop()
        raise
    return ha
