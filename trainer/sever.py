"""Sever this process's TCP connections to hosts the control plane declared lost.

A peer that dies on a live host resets its connections, so a collective waiting on it fails at
once and the worker parks (:mod:`unicron.trainer.regroup`). A peer behind a cut link or a dead
machine says nothing: the collective would wait out its timeout (minutes) while the rest of the job
has already been re-planned. A regroup directive names the hosts the new generation leaves behind as
lost (``RegroupDirective.lost_hosts``); shutting this process's connections to them down makes
the blocked collective fail now, exactly as if the peer had reset them, and the worker parks and
takes the directive. The sockets belong to the old process group, which the regroup abandons.

Linux only: the connections are found through ``/proc/self/fd`` and ``/proc/self/net/tcp*``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Iterable
from pathlib import Path

from unicron.shared.logging import get_logger

log = get_logger(component="unicron.trainer.sever")

PROC = Path("/proc/self")


def _remote(hex_address: str) -> str:
    """The IP of a ``/proc/net/tcp*`` address field (``0100007F:1F90``, host byte order)."""
    host = bytes.fromhex(hex_address.split(":")[0])
    if len(host) == 4:
        return str(ipaddress.IPv4Address(host[::-1]))
    words = b"".join(host[i : i + 4][::-1] for i in range(0, 16, 4))
    mapped = ipaddress.IPv6Address(words)
    return str(mapped.ipv4_mapped or mapped)


def _remotes_by_inode() -> dict[str, str]:
    found: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (PROC / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()
                found[fields[9]] = _remote(fields[2])
    return found


def connections_to(hosts: Iterable[str]) -> list[int]:
    """File descriptors of this process's TCP connections to any of ``hosts`` (IP strings)."""
    wanted = {str(ipaddress.ip_address(h)) for h in hosts}
    remotes = _remotes_by_inode()
    fds = []
    for entry in os.scandir(PROC / "fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(entry.path)
            if target.startswith("socket:[") and remotes.get(target[8:-1]) in wanted:
                fds.append(int(entry.name))
    return fds


def sever(hosts: Iterable[str]) -> int:
    """Shut down every TCP connection to ``hosts``; how many. Never raises."""
    hosts = list(hosts)
    try:
        fds = connections_to(hosts)
    except (OSError, ValueError) as exc:
        log.warning("cannot list connections to sever", error=repr(exc))
        return 0
    for fd in fds:
        # A duplicate: shutdown acts on the connection, and closing the duplicate leaves the
        # owner's descriptor (gloo's) valid for it to see the failure.
        with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    if fds:
        log.warning("severed connections to lost hosts", hosts=hosts, connections=len(fds))
    return len(fds)
