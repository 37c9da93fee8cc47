"""The address peers use to reach this node's stores, and the checks that it can work.

Unset (``UNICRON_HOST``), it is the local address of the route to the NATS server: a node on
one host with NATS gets 127.0.0.1, a node of a cluster the interface its peers share with the
control plane. An explicit loopback address while NATS is elsewhere is refused before the agent
connects anywhere, since every peer on another machine would dial its own loopback. Once the
rendezvous store listens, :func:`check_reachable` connects to the advertised address, so a
store bound to another interface or behind a firewall fails the start, not the first regroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from urllib.parse import urlsplit

NATS_DEFAULT_PORT = 4222
REACH_TIMEOUT_S = 2.0


class AddressError(ValueError):
    """The node's advertised address cannot work; the message says which setting to fix."""


def nats_endpoint(nats_url: str) -> tuple[str, int]:
    """Host and port of the first server in ``UNICRON_NATS_URL`` (a comma-separated list)."""
    first = nats_url.split(",")[0].strip()
    parts = urlsplit(first if "://" in first else f"nats://{first}")
    if not parts.hostname:
        raise AddressError(f"UNICRON_NATS_URL {nats_url!r} names no host")
    return parts.hostname, parts.port or NATS_DEFAULT_PORT


def addresses(host: str, port: int = 0) -> list[tuple[int, str]]:
    """(family, address) of ``host``, IPv4 first; empty when the name does not resolve."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError):
        return []
    found = [(int(family), str(sockaddr[0])) for family, _, _, _, sockaddr in infos]
    return sorted(dict.fromkeys(found), key=lambda item: item[0] != socket.AF_INET)


def is_loopback(host: str) -> bool | None:
    """Whether ``host`` names this machine's loopback only; None when it does not resolve."""
    found = addresses(host)
    if not found:
        return None
    return all(ipaddress.ip_address(addr.split("%")[0]).is_loopback for _, addr in found)


def route_address(host: str, port: int) -> str:
    """The local address the kernel would send from to reach ``host:port``. A UDP socket's
    connect() only picks the route: no packet is sent, and NATS need not be up."""
    errors = []
    for family, addr in addresses(host, port):
        with contextlib.closing(socket.socket(family, socket.SOCK_DGRAM)) as sock:
            try:
                sock.connect((addr, port))
                return str(sock.getsockname()[0])
            except OSError as exc:
                errors.append(f"{addr}: {exc}")
    why = "; ".join(errors) or "the name does not resolve"
    raise AddressError(
        f"cannot tell which address peers reach this node at: no route to the NATS host "
        f"{host!r} ({why}); set UNICRON_HOST to this node's address"
    )


def advertised_host(host: str | None, nats_url: str) -> str:
    """``host`` (``UNICRON_HOST``) checked against NATS's, or the address of the route to NATS."""
    nats_host, nats_port = nats_endpoint(nats_url)
    if host is None:
        return route_address(nats_host, nats_port)
    # A NATS name that does not resolve now says nothing of where it is: connecting reports it.
    if is_loopback(host) and is_loopback(nats_host) is False:
        raise AddressError(
            f"UNICRON_HOST={host} is a loopback address but UNICRON_NATS_URL is "
            f"{_without_login(nats_url)}, on another "
            "machine: peers there could not reach this node's rendezvous store. Set UNICRON_HOST "
            "to an address they can reach, or leave it unset to use the route to NATS"
        )
    return host


def _without_login(nats_url: str) -> str:
    """The first URL with any user and password left out: the message goes to a log."""
    host, port = nats_endpoint(nats_url)
    first = nats_url.split(",")[0].strip()
    scheme = urlsplit(first).scheme if "://" in first else "nats"
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


async def check_reachable(host: str, port: int, setting: str) -> None:
    """Connect to ``host:port`` as a peer would; ``AddressError`` naming ``setting`` if not."""
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), timeout=REACH_TIMEOUT_S
        )
    except (OSError, TimeoutError) as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
        raise AddressError(
            f"this node advertises {host}:{port} for its rendezvous store, but connecting there "
            f"failed ({why}): the store listens on another interface or a firewall blocks the "
            f"port. Fix {setting}"
        ) from None
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
