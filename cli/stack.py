"""The whole stack on one machine: embedded NATS + Redis, the services and N node agents.

``unicron up`` runs it in the foreground; the demo and the end-to-end tests use :class:`Stack`.
Every child dies with this process, and a service, agent or embedded server that exits
unexpectedly is started again (with back-off, see :mod:`unicron.cli.restarts`); Redis and NATS come
back on the same port and data directory, with what they had stored.

``unicron up --ha`` starts a control plane that survives losing a server instead: three
clustered NATS servers with the streams on all three (shared/servers/natscluster.py), and a Redis
primary, its replica and three Sentinels (shared/servers/redisha.py). A Redis server that died comes
back as the replica of whichever one the Sentinels promoted meanwhile. The planner and the
executor each run twice then, one active and one warm standby on the role's lease.
"""

from __future__ import annotations

import functools
import os
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from unicron.cli.children import Child
from unicron.cli.gpushare import GpuShare, share_gpus
from unicron.cli.readiness import wait_until_ready
from unicron.cli.restarts import RestartBackoff
from unicron.services.agent.gpus import visible_devices
from unicron.shared.bus.natslogin import NatsAccess
from unicron.shared.contracts.roles import ServiceRole, ServiceUser, stack_users
from unicron.shared.logging import get_logger
from unicron.shared.procs import free_port
from unicron.shared.servers.credentials import StackLogins, load_or_create
from unicron.shared.servers.embedded import (
    EmbeddedServer,
    EmbeddedServerError,
    RestartDeferred,
    start_nats,
    start_redis,
)
from unicron.shared.servers.natscluster import cluster_url, start_nats_cluster
from unicron.shared.servers.redisha import MASTER_NAME, RedisHa, start_redis_ha
from unicron.shared.settings import CommonSettings

log = get_logger(component="stack")

SERVICE_MODULES = (
    "unicron.services.api",
    "unicron.services.detector",
    "unicron.services.planner",
    "unicron.services.executor",
)
AGENT_MODULE = "unicron.services.agent"
LEASED_ROLES = ("planner", "executor")  # one active instance under a lease


@dataclass
class StackConfig:
    nodes: int = 2
    slots: int | None = None  # each agent's workers; None: 2 on CPU, one per GPU of its share
    nats_url: str | None = None
    redis_url: str | None = None
    api_port: int = 8080
    data_dir: Path = Path(".unicron")
    log_level: str = "INFO"
    extra_env: dict[str, str] = field(default_factory=dict)
    # one agent's own additions, by node id (the GPU suite gives each its own NCCL_HOSTID)
    node_env: dict[str, dict[str, str]] = field(default_factory=dict)
    ha: bool = False  # a NATS cluster and a Redis with a replica and Sentinels
    devices: list[str] | None = None  # the host's GPUs to share out; None: what CUDA shows


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.servers: list[EmbeddedServer] = []
        self.children: dict[str, Child] = {}
        self.backoff = RestartBackoff()
        self.nats_url = config.nats_url or ""
        self.redis_url = config.redis_url or ""
        self.node_ids = [f"node-{index}" for index in range(config.nodes)]
        self.logins: StackLogins | None = None  # docs/design.md §11
        self.redis_ha: RedisHa | None = None
        self.servers_env: dict[str, str] = {}  # how the children find --ha's servers
        self.metrics_urls: dict[str, str] = {}  # where each child serves /metrics, by name
        self.gpus = GpuShare([])  # each agent's GPUs, known at start (cli/gpushare.py)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.config.api_port}"

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            UNICRON_NATS_URL=self.nats_url,
            UNICRON_REDIS_URL=self.redis_url,
            UNICRON_DATA_DIR=str(self.data_dir),
            UNICRON_API_PORT=str(self.config.api_port),
            UNICRON_LOG_LEVEL=self.config.log_level,
        )
        env.update(self.servers_env)
        env.update(self.config.extra_env)
        env.update(extra)
        return env

    def start(self, ready_timeout_s: float = 60.0) -> None:
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        devices = self.config.devices
        # before any server: a --slots the GPUs cannot give fails here, with its reason
        self.gpus = share_gpus(
            visible_devices() if devices is None else devices, self.config.nodes, self.config.slots
        )
        self.start_servers()
        for module in SERVICE_MODULES:
            role = module.split(".")[-1]
            user = ServiceUser(role=ServiceRole(role))
            for name in self.instances(role):
                env = self.env(**self.login_env(user), **self.instance_env(name))
                self._add(name, module, env | self.metrics_env(name))
        for node_id, share in zip(self.node_ids, self.gpus.envs, strict=True):
            agent = ServiceUser(role=ServiceRole.AGENT, node_id=node_id)
            env = self.env(UNICRON_NODE_ID=node_id, **share, **self.login_env(agent))
            env.update(self.config.node_env.get(node_id, {}))
            self._add(f"agent-{node_id}", AGENT_MODULE, env | self.metrics_env(f"agent-{node_id}"))
        self.wait_ready(ready_timeout_s)

    def start_servers(self) -> None:
        """Start the servers not given by URL, each admitting only the stack's users."""
        if self.nats_url and self.redis_url:
            return
        users = stack_users(self.node_ids)
        self.logins = StackLogins(load_or_create(self.data_dir / "secrets", users))
        if not self.nats_url:
            tls = self.logins.serve_nats(CommonSettings())
            nats = self.logins.credentials.nats_logins(users)
            if self.config.ha:
                cluster = start_nats_cluster(self.data_dir / "nats-ha", logins=nats, tls=tls)
                self.servers += cluster
                self.nats_url = cluster_url(cluster)
                self.servers_env["UNICRON_STREAM_REPLICAS"] = str(len(cluster))
            else:
                self.servers.append(start_nats(self.data_dir / "nats", logins=nats, tls=tls))
                self.nats_url = self.servers[-1].url
        if not self.redis_url:
            redis = self.logins.credentials.redis_logins(users)
            if self.config.ha:
                self.redis_ha = start_redis_ha(self.data_dir / "redis-ha", logins=redis)
                self.servers += self.redis_ha.servers
                self.redis_url = self.logins.redis_url = self.redis_ha.login_url
                self.servers_env["UNICRON_REDIS_SENTINELS"] = self.redis_ha.sentinels_setting
                self.servers_env["UNICRON_REDIS_MASTER"] = MASTER_NAME
            else:
                self.servers.append(start_redis(self.data_dir / "redis", logins=redis))
                self.redis_url = self.logins.redis_url = self.servers[-1].url

    def instances(self, role: str) -> list[str]:
        """The processes of a service: with ``--ha``, a warm standby beside the planner and
        the executor, which take over within their lease's TTL (shared/terms.py)."""
        standby = self.config.ha and role in LEASED_ROLES
        return [role, f"{role}-standby"] if standby else [role]

    def instance_env(self, name: str) -> dict[str, str]:
        """This stack runs each process one at a time and restarts it when it dies: a
        restarted one may take its predecessor's lease at once (shared/store/lease.py)."""
        role = name.split("-")[0]
        if role not in LEASED_ROLES:
            return {}
        return {f"UNICRON_{role.upper()}_INSTANCE": f"unicron-up:{self.data_dir}:{name}"}

    def metrics_env(self, name: str) -> dict[str, str]:
        """A free port for the child ``name``'s /metrics (agents share a machine); the API's own."""
        if name == "api":
            self.metrics_urls[name] = f"{self.api_url}/metrics"
            return {}
        port = free_port()
        self.metrics_urls[name] = f"http://127.0.0.1:{port}/metrics"
        return {"UNICRON_METRICS_PORT": str(port)}

    def login_env(self, user: ServiceUser) -> dict[str, str]:
        return self.logins.env(user) if self.logins else {}

    def operator_access(self) -> NatsAccess:
        """How a tool (a benchmark, a test) logs in to this stack's NATS: as its operator when
        the stack started NATS, else as the environment says."""
        access = self.logins.operator_access() if self.logins else None
        return access or CommonSettings().nats_access

    def _add(self, name: str, module: str, env: dict[str, str]) -> None:
        child = Child(name, module, env)
        self.children[name] = child
        self.spawn(child)

    def spawn(self, child: Child) -> None:
        child.spawn(self.data_dir / "logs")

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until the API answers /readyz and every agent's node is registered."""
        logs = self.data_dir / "logs"
        env = self.env()
        wait_until_ready(self.api_url, self.config.nodes, env, self.check_alive, timeout_s, logs)

    def check_alive(self) -> None:
        for child in self.children.values():
            if child.exited() is not None:
                raise RuntimeError(child.died(self.data_dir / "logs"))

    def restart_exited(self, backoff: bool = False) -> list[str]:
        """Start again every server, then every child, that exited; returns their names.

        With ``backoff`` a process in a crash loop waits its turn (``unicron up``); without,
        all start now (a test or benchmark that killed one on purpose).
        """
        restarted = []
        for server in self.servers:
            if self._restart(server.name, server.process, server.restart, backoff):
                restarted.append(server.name)
        for child in self.children.values():
            if child.process is None:
                continue
            start = functools.partial(self.spawn, child)
            if self._restart(child.name, child.process, start, backoff):
                restarted.append(child.name)
        return restarted

    def _restart(
        self, name: str, proc: subprocess.Popen[bytes], start: Callable[[], None], backoff: bool
    ) -> bool:
        code = proc.poll()
        if code is None or (not self.backoff.due(name) and backoff):
            return False
        try:
            start()
        except RestartDeferred as exc:  # a Redis waiting for the Sentinels' promotion: asked
            log.debug("restart deferred", name=name, reason=str(exc))  # again next tick
            return False
        except EmbeddedServerError as exc:  # e.g. its port was taken meanwhile: try later
            log.error("restart failed", name=name, exit_code=code, error=str(exc))
            self.backoff.started(name)
            return False
        count = self.backoff.started(name)
        log.warning("restarted", name=name, exit_code=code, restarts=count)
        return True

    def supervise(self, stop: threading.Event, interval_s: float = 0.1) -> None:
        """Restart what exits, with back-off, until ``stop`` is set (``unicron up``'s loop);
        polled often, since a dead detector or planner delays every recovery until it is back."""
        while not stop.wait(interval_s):
            self.restart_exited(backoff=True)

    def stop(self) -> None:
        # Agents last among the services so they can stop their workers cleanly.
        order = sorted(self.children.values(), key=lambda c: c.module == AGENT_MODULE)
        for child in order:
            if child.process is not None and child.process.poll() is None:
                child.process.terminate()
        for child in order:
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        for server in reversed(self.servers):
            server.stop()
        self.servers.clear()

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
