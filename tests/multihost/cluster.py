"""A Unicron cluster across network namespaces: the control plane on one host, agents on others.

The control-plane host runs NATS (JetStream), Redis, the API, detector, planner and executor,
each listening on that host's address; every node host runs one agent with its own data
directory — nothing is shared but the network (tests/multihost/netns.py). The test reaches the
API over the same network, as an operator's laptop would.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from unicron.shared.procs import port_open
from unicron.shared.servers.embedded import nats_server_binary, redis_server_binary

from tests import waiting
from tests.multihost.netns import Network

CONTROL = "cp"
NODES = ["n1", "n2", "n3"]
FIGURES = Path(".unicron/multihost.json")
NATS_PORT, REDIS_PORT, API_PORT = 4222, 6379, 8080
SERVICES = ("api", "detector", "planner", "executor")


class Cluster:
    def __init__(self, network: Network, nodes: list[str], data: Path) -> None:
        self.net = network
        self.nodes = nodes
        self.data = data
        cp = network.hosts[CONTROL].address
        self.nats_url = f"nats://{cp}:{NATS_PORT}"
        self.redis_url = f"redis://{cp}:{REDIS_PORT}/0"
        self.api_url = f"http://{cp}:{API_PORT}"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("UNICRON_")}
        env.update(
            UNICRON_NATS_URL=self.nats_url,
            UNICRON_REDIS_URL=self.redis_url,
            UNICRON_LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    def start(self) -> None:
        cp = self.net.hosts[CONTROL].address
        logs = self.data / "logs"
        nats = [nats_server_binary(), "-js", "-a", cp, "-p", str(NATS_PORT)]
        self.net.spawn(CONTROL, [*nats, "-sd", str(self.data / "nats")], self.env(), logs / "nats")
        # no logins on this private test network; a real deployment uses them (docs/design.md §11)
        redis = [redis_server_binary(), "--bind", cp, "--port", str(REDIS_PORT), "--save", ""]
        redis += ["--protected-mode", "no"]
        self.net.spawn(CONTROL, redis, self.env(), logs / "redis")
        wait_for("NATS and Redis", lambda: self._listening(cp, NATS_PORT, REDIS_PORT), 20)
        for name in SERVICES:
            env = self.env(
                UNICRON_DATA_DIR=str(self.data / "control"),
                UNICRON_API_HOST=cp,
                UNICRON_API_PORT=str(API_PORT),
                UNICRON_API_ALLOW_UNAUTHENTICATED_BIND="true",
            )
            self.net.spawn(CONTROL, self._python(f"unicron.services.{name}"), env, logs / name)
        for node in self.nodes:
            self.start_agent(node)

    def start_agent(self, node: str) -> None:
        env = self.env(
            UNICRON_NODE_ID=node,
            UNICRON_SLOTS="1",
            UNICRON_DATA_DIR=str(self.data / node),
            UNICRON_CHECKPOINT_MIRROR_S="1",  # scripts' checkpoints follow them (test_scripts)
        )
        self.net.spawn(node, self._python("unicron.services.agent"), env, self.data / "logs" / node)

    @staticmethod
    def _python(module: str) -> list[str]:
        return [sys.executable, "-m", module]

    @staticmethod
    def _listening(host: str, *ports: int) -> bool:
        return all(port_open(host, port, timeout_s=0.5) for port in ports)

    # --- the API, as the test sees it ------------------------------------------------------

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.api_url, timeout=10)

    def ready_nodes(self, api: httpx.Client) -> set[str]:
        response = api.get("/v1/nodes")
        response.raise_for_status()
        return {n["id"] for n in response.json() if n["state"] == "READY"}

    def node_state(self, api: httpx.Client, node: str) -> str | None:
        response = api.get("/v1/nodes")
        response.raise_for_status()
        return next((n["state"] for n in response.json() if n["id"] == node), None)

    def job(self, api: httpx.Client, job_id: str) -> dict[str, Any]:
        response = api.get(f"/v1/jobs/{job_id}")
        response.raise_for_status()
        return dict(response.json())


def wait_for(
    what: str, probe: Callable[[], Any], timeout_s: float, interval_s: float = 0.05
) -> Any:
    """:func:`tests.waiting.wait_for`, polling faster and riding over an API still starting."""
    return waiting.wait_for(what, probe, timeout_s, interval_s, tolerate=(httpx.HTTPError,))


@contextmanager
def running_cluster(nodes: list[str], data: Path) -> Iterator[Cluster]:
    network = Network([CONTROL, *nodes]).open()
    try:
        cluster = Cluster(network, nodes, data)
        cluster.start()
        yield cluster
    finally:
        network.close()


def record_figures(figures: dict[str, float]) -> None:
    """Add ``figures`` to the one JSON line `make test-multihost` prints last."""
    known = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    known.update({k: round(v, 3) for k, v in figures.items()})
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(known) + "\n")
