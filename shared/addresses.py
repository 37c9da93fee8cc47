"""The server lists in the settings, parsed: several NATS servers (``UNICRON_NATS_URL``,
comma-separated) and Redis's Sentinels (``UNICRON_REDIS_SENTINELS``), with messages that say
which entry is wrong and never repeat a password (docs/design.md §6).

Kept free of client imports: the settings and the NATS login both parse with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

_SCHEMES = ("nats", "tls")


class ServerListError(ValueError):
    """A server list that names no usable server."""


def nats_servers(url: str) -> list[str]:
    """The servers in ``url``: one ``nats://`` or ``tls://`` URL, or several comma-separated."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ServerListError(
            "UNICRON_NATS_URL is empty: give nats://HOST:PORT[,nats://HOST:PORT...]"
        )
    for server in servers:
        parts = urlsplit(server)
        if parts.scheme not in _SCHEMES or not parts.hostname:
            shown = f"{parts.scheme}://{parts.hostname or ''}" if parts.scheme else "(no scheme)"
            raise ServerListError(
                f"UNICRON_NATS_URL entry {shown!r} is not nats://HOST:PORT or tls://HOST:PORT"
            )
    if len({urlsplit(s).scheme for s in servers}) > 1:
        raise ServerListError("UNICRON_NATS_URL mixes nats:// and tls:// servers")
    return servers


def parse_sentinels(text: str) -> list[tuple[str, int]]:
    """``host:port,host:port,...`` as (host, port) pairs."""
    sentinels = []
    for entry in (part.strip() for part in text.split(",")):
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ServerListError(
                f"UNICRON_REDIS_SENTINELS entry {entry!r} is not HOST:PORT "
                "(give host:port,host:port,... of the Sentinels)"
            )
        sentinels.append((host, int(port)))
    return sentinels


@dataclass(frozen=True)
class SentinelTarget:
    """Where a client finds the Redis primary: ask these Sentinels for ``master``."""

    sentinels: tuple[tuple[str, int], ...]
    master: str = "unicron"
    # Replicas that must confirm each write before it counts as done (shared/store/replicated.py).
    replicas: int = 1
    # The Sentinels' own password (their requirepass), when they ask for one.
    password: str | None = field(default=None, repr=False)
