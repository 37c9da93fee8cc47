"""How a client logs in to NATS: its user, password and inbox prefix, TLS trust, and a first
connection that ends at once when the server refuses the login (docs/design.md §11).

Which subjects each user may use is shared/bus/natsauth.py's business; this is the client's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient
from pydantic import BaseModel, ConfigDict, SecretStr
from unicron.shared.addresses import nats_servers
from unicron.shared.bus.natsauth import inbox_prefix
from unicron.shared.contracts.roles import CredentialsError, ServiceUser
from unicron.shared.logging import get_logger
from unicron.shared.outage import Outage

log = get_logger(component="bus")
DRAIN_TIMEOUT_S = 2.0  # a shutdown must not wait 30 s (nats-py's default) on a drain


class NatsAccess(BaseModel):
    """How one client logs in: its user and password (none: anonymous, as a development
    server allows) and, for a tls:// server with a private CA, that CA's certificate."""

    model_config = ConfigDict(frozen=True)

    user: str | None = None
    password: SecretStr | None = None
    tls_ca: Path | None = None

    def options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``."""
        options: dict[str, Any] = {}
        if self.user is not None:
            password = self.password.get_secret_value() if self.password else None
            options.update(user=self.user, password=password)
            options["inbox_prefix"] = inbox_prefix(self.user)
        if self.tls_ca is not None:
            options["tls"] = ssl.create_default_context(cafile=str(self.tls_ca))
        return options

    @property
    def manages_streams(self) -> bool:
        """Anonymous (a development server) or a managing role: create the streams."""
        if self.user is None:
            return True
        user = ServiceUser.of(self.user)
        return user is not None and user.role.manages_streams

    def refusal(self, url: str) -> CredentialsError:
        who = f"user {self.user!r}" if self.user else "an anonymous client"
        fix = (
            "check UNICRON_NATS_USER and UNICRON_NATS_PASSWORD"
            if self.user
            else "set UNICRON_NATS_USER and UNICRON_NATS_PASSWORD"
        )
        return CredentialsError(f"NATS at {url} refused {who} (authorization violation): {fix}")


def is_refusal(exc: BaseException) -> bool:
    """Whether nats-py's error says the server refused the login (not that it is away)."""
    return isinstance(exc, nats.errors.AuthorizationError) or (
        "authorization violation" in str(exc).lower()
    )


def is_permission_violation(exc: BaseException) -> bool:
    return "permissions violation" in str(exc).lower()


async def open_client(
    url: str, source: str, timeout_s: float, access: NatsAccess, link: Outage
) -> NatsClient:
    """A client connected as ``access``, or ``CredentialsError`` / ``TimeoutError``.

    nats-py retries its first connection forever (unlimited reconnects), a refused login
    included: race it against the refusal and the deadline.
    """
    nc = NatsClient()
    refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def on_error(exc: Exception) -> None:
        if is_permission_violation(exc):  # a gap in the permission table, not an outage
            log.error("nats refused a subject to this user", user=access.user, error=str(exc))
        elif is_refusal(exc) and not nc.is_connected:
            if not refused.done():
                refused.set_result(None)
        else:
            link.failed(exc)

    async def on_reconnected() -> None:
        link.ok()

    options: dict[str, Any] = dict(
        name=source, max_reconnect_attempts=-1, reconnect_time_wait=0.5,
        drain_timeout=DRAIN_TIMEOUT_S, error_cb=on_error, reconnected_cb=on_reconnected,
    )  # fmt: skip
    servers = nats_servers(url)  # one, or a cluster's, any of which will do
    connecting = asyncio.ensure_future(nc.connect(servers, **options, **access.options()))
    await asyncio.wait({connecting, refused}, timeout=timeout_s, return_when="FIRST_COMPLETED")
    if connecting.done():
        connecting.result()  # its own error, if it raised one
        return nc
    connecting.cancel()
    with contextlib.suppress(BaseException):
        await nc.close()
    if refused.done():
        raise access.refusal(url)
    raise TimeoutError(f"NATS at {url} not reachable in {timeout_s:g} s")
