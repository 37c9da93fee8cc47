"""A NATS JetStream cluster: the servers a client may connect to, and three embedded servers
for ``unicron up --ha`` and the tests (docs/design.md §6).

``UNICRON_NATS_URL`` names one server or, comma-separated, several; the client connects to any
and fails over to the others by itself. The streams are kept on ``UNICRON_STREAM_REPLICAS``
servers (:mod:`unicron.shared.bus.bus`): at 3, losing any one server loses no acknowledged message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from unicron.shared.bus.natsauth import NatsTls, render_server_config
from unicron.shared.contracts.roles import ServiceUser
from unicron.shared.procs import free_port
from unicron.shared.servers.credentials import kept_secret, write_private
from unicron.shared.servers.embedded import (
    EmbeddedServer,
    EmbeddedServerError,
    nats_server_binary,
    spawn_server,
)

CLUSTER_NAME = "unicron"
ROUTE_USER = "route"  # the servers' login to each other, never a client's


def _config(
    index: int,
    ports: Sequence[tuple[int, int, int]],
    store: Path,
    logins: Sequence[tuple[ServiceUser, str]],
    tls: NatsTls | None,
    route_secret: str,
) -> dict[str, Any]:
    client_port, route_port, monitor_port = ports[index]
    listen = f"127.0.0.1:{client_port}"
    config: dict[str, Any] = (
        json.loads(render_server_config(logins, listen, store, tls))
        if logins
        else {"listen": listen, "jetstream": {"store_dir": str(store)}}
    )
    peers = [p for i, (_, p, _) in enumerate(ports) if i != index]
    login = f"{ROUTE_USER}:{route_secret}@"
    config["server_name"] = f"{CLUSTER_NAME}-{index}"
    config["http"] = f"127.0.0.1:{monitor_port}"  # /healthz: is JetStream ready
    # Routes log in too: anyone else on the host could otherwise join a server of their own
    # to the cluster and read every stream.
    config["cluster"] = {
        "name": CLUSTER_NAME,
        "listen": f"127.0.0.1:{route_port}",
        "authorization": {"user": ROUTE_USER, "password": route_secret},
        "routes": [f"nats://{login}127.0.0.1:{p}" for p in peers],
    }
    return config


def start_nats_cluster(
    workdir: Path,
    size: int = 3,
    logins: Sequence[tuple[ServiceUser, str]] = (),
    tls: NatsTls | None = None,
    timeout_s: float = 15.0,
) -> list[EmbeddedServer]:
    """``size`` clustered NATS servers on free loopback ports, each with its JetStream store in
    ``workdir/node-<i>`` and a configuration file there (0600). With ``logins`` only those
    users may connect (shared/bus/natsauth.py). Returns once every server listens; JetStream
    elects its leaders in the next seconds (a client's first stream request waits for them).
    """
    if tls is not None and not logins:
        raise ValueError("TLS for the embedded NATS needs logins as well")
    workdir.mkdir(parents=True, exist_ok=True)
    secret = kept_secret(workdir / "route.secret")  # the cluster's route password
    ports = [(free_port(), free_port(), free_port()) for _ in range(size)]
    servers = []
    try:
        for index, (client_port, _, _) in enumerate(ports):
            node = workdir / f"node-{index}"
            node.mkdir(exist_ok=True)
            config = _config(index, ports, node / "jetstream", logins, tls, secret)
            path = node / "nats.conf"
            write_private(path, json.dumps(config, indent=2) + "\n")
            cmd = [nats_server_binary(), "-c", str(path)]
            scheme = "tls" if tls is not None else "nats"
            url = f"{scheme}://127.0.0.1:{client_port}"
            name = f"nats-{index}"
            servers.append(spawn_server(name, cmd, client_port, url, node / "nats.log", timeout_s))
        wait_jetstream([monitor for _, _, monitor in ports], timeout_s)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def wait_jetstream(monitor_ports: Sequence[int], timeout_s: float) -> None:
    """Wait until every server says JetStream is healthy: the cluster elected its leader."""
    deadline = time.monotonic() + timeout_s
    waiting = list(monitor_ports)
    while waiting:
        if time.monotonic() >= deadline:
            raise EmbeddedServerError(f"JetStream not ready in {timeout_s:g}s (ports {waiting})")
        waiting = [port for port in waiting if not _healthy(port)]
        time.sleep(0.1)


def _healthy(monitor_port: int) -> bool:
    try:
        url = f"http://127.0.0.1:{monitor_port}/healthz"
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def cluster_url(servers: Sequence[EmbeddedServer]) -> str:
    """The ``UNICRON_NATS_URL`` that names every server of a cluster."""
    return ",".join(server.url for server in servers)
