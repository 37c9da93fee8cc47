"""A NATS server with the logins ``unicron up`` generates, and clients that log in as each of
its users: a raw nats-py client, as an attacker would use one, or a service's own Bus."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from unicron.shared.bus.bus import STREAMS, Bus
from unicron.shared.bus.natsauth import NatsTls
from unicron.shared.bus.natslogin import NatsAccess
from unicron.shared.contracts.roles import ServiceRole, ServiceUser, stack_users
from unicron.shared.servers.credentials import ClusterCredentials
from unicron.shared.servers.embedded import EmbeddedServer, start_nats

USERS = stack_users(["node-0", "node-1"])
CREDENTIALS = ClusterCredentials().with_users(USERS)
API, DETECTOR, PLANNER, EXECUTOR, ADMIN = (
    ServiceUser(role=role)
    for role in (ServiceRole.API, ServiceRole.DETECTOR, ServiceRole.PLANNER,
                 ServiceRole.EXECUTOR, ServiceRole.ADMIN)
)  # fmt: skip
AGENT_0 = ServiceUser(role=ServiceRole.AGENT, node_id="node-0")
AGENT_1 = ServiceUser(role=ServiceRole.AGENT, node_id="node-1")


def access(user: ServiceUser) -> NatsAccess:
    return CREDENTIALS.nats_access(user)


class Client:
    """A raw nats-py client, as an attacker would use one, that keeps what the server refused."""

    def __init__(self) -> None:
        self.nc = NatsClient()
        self.refusals: list[str] = []
        self._news = asyncio.Condition()

    async def on_error(self, exc: Exception) -> None:
        async with self._news:
            self.refusals.append(str(exc))
            self._news.notify_all()

    async def refused(self, subject: str, timeout_s: float = 5.0) -> bool:
        """Whether the server refused ``subject`` (its error comes on its own, after the call;
        nats-py lowercases it)."""

        def seen() -> bool:
            return any(f'"{subject.lower()}"' in refusal for refusal in self.refusals)

        async with self._news:
            try:
                await asyncio.wait_for(self._news.wait_for(seen), timeout_s)
            except TimeoutError:
                return False
        return True

    def js(self) -> JetStreamContext:
        return self.nc.jetstream(timeout=1.0)  # a refused API call is a timeout: keep it short


@asynccontextmanager
async def login(server: EmbeddedServer, user: ServiceUser) -> AsyncIterator[Client]:
    client = Client()
    options = access(user).options()
    await client.nc.connect(server.url, error_cb=client.on_error, allow_reconnect=False, **options)
    try:
        yield client
    finally:
        await client.nc.close()


@asynccontextmanager
async def bus_of(server: EmbeddedServer, user: ServiceUser) -> AsyncIterator[Bus]:
    bus = await Bus.connect(server.url, f"unicron/{user.name}", 10, access(user))
    try:
        yield bus
    finally:
        await bus.close()


@pytest.fixture
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    workdir = tmp_path_factory.mktemp("secured-nats")
    server = start_nats(workdir, logins=CREDENTIALS.nats_logins(USERS))
    yield server
    server.stop()


@pytest.fixture
async def api(secured: EmbeddedServer) -> AsyncIterator[Bus]:
    """The API's bus: the stream manager, so the streams exist for everyone else."""
    async with bus_of(secured, API) as bus:
        yield bus


async def counts(server: EmbeddedServer) -> dict[str, int]:
    """Messages in each stream, as the operator sees them."""
    async with login(server, ADMIN) as admin:
        js = admin.js()
        return {name: (await js.stream_info(name)).state.messages for name in STREAMS}


def self_signed(directory: Path) -> NatsTls:
    """A certificate and key for 127.0.0.1, valid a day: its own CA."""
    tls = NatsTls(cert=directory / "nats.crt", key=directory / "nats.key")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(tls.key), "-out", str(tls.cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return tls
