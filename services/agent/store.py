"""The node's rendezvous store: one TCPStore hosted by the agent for the node's whole life.

Workers of every generation meet in it under a per-generation prefix, so a rendezvous
outlives any worker that dies (docs/design.md §5). The agent binds the listening socket itself and
hands it to torch, so the store listens on the configured address only — TCPStore alone would
listen on every interface. By default that is the advertised address
(``unicron.services.agent.address``), an address of this machine whether set or found from the route
to NATS; only behind a NAT, where the advertised address is not the machine's own, does
``UNICRON_STORE_BIND_HOST`` need setting (0.0.0.0 then opens it on every interface).

With ``UNICRON_STORE_PORTS`` the store, and every master store (``unicron.services.agent.master``),
takes the first free port of the range, so a firewall need open only that range.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import TYPE_CHECKING

from unicron.services.agent.address import AddressError, check_reachable
from unicron.shared.logging import get_logger

if TYPE_CHECKING:
    # torch defines TCPStore in a C extension and does not list it in torch.distributed's
    # exports, hence the ignores on both imports.
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

log = get_logger(component="store")
# One port (0: any free one), or a range (``UNICRON_STORE_PORTS``) whose first free port is taken.
Ports = int | range


class StorePortsExhaustedError(RuntimeError):
    """Every port of ``UNICRON_STORE_PORTS`` is taken on this address."""


def _listen_on(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(512)
    except OSError:
        sock.close()
        raise
    return sock


def _listen(host: str, ports: Ports) -> socket.socket:
    """A socket listening on the first port of ``ports`` that is free on ``host``."""
    if isinstance(ports, int):
        return _listen_on(host, ports)
    for port in ports:
        try:
            return _listen_on(host, port)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise StorePortsExhaustedError(
        f"no free port left in UNICRON_STORE_PORTS={ports.start}-{ports.stop - 1} on {host}: "
        f"all {len(ports)} are in use (this node's stores or other programs); widen the range",
    )


def host_store(bind_host: str, ports: Ports) -> TCPStore:
    # torch is imported here, not at module level: it costs ~2 s and only this needs it.
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    sock = _listen(bind_host, ports)
    # The store connects a client of its own to this address: the one it listens on, never the
    # advertised one, where it would retry for its whole 300-s timeout if peers could not reach
    # it (``unicron.services.agent.address`` checks that, with a clear error, once it is up).
    own = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind_host, bind_host)
    try:
        store = TCPStore(
            own,
            sock.getsockname()[1],
            is_master=True,
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
            use_libuv=True,
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now and closes it when it is destroyed
    return store


class RendezvousStore:
    def __init__(self, host: str, ports: Ports = 0, bind_host: str | None = None) -> None:
        self.host = host
        self.bind_host = bind_host or host
        self.ports = ports
        self._store: TCPStore | None = None

    @property
    def port(self) -> int:
        if self._store is None:
            raise RuntimeError("store not started")
        return int(self._store.port)

    async def start(self) -> int:
        """Host the store (in a thread: importing torch and binding block) and return its port."""
        self._store = await asyncio.to_thread(host_store, self.bind_host, self.ports)
        log.info("rendezvous store listening", host=self.bind_host, port=self.port)
        return self.port

    async def start_reachable(self) -> int:
        """Listen, then connect to the advertised address as a peer would: a store that peers
        cannot reach fails the agent's start, not every job's first rendezvous."""
        bind = self.bind_host
        try:
            port = await self.start()
        except OSError as exc:
            raise AddressError(
                f"the rendezvous store cannot listen on {bind} ({exc}): set UNICRON_HOST (or "
                "UNICRON_STORE_BIND_HOST) to an address of this machine, and UNICRON_STORE_PORT "
                "or UNICRON_STORE_PORTS to a free port"
            ) from None
        fix = "UNICRON_HOST" if bind == self.host else "UNICRON_HOST or UNICRON_STORE_BIND_HOST"
        await check_reachable(self.host, port, f"{fix}, or open the port in the firewall")
        return port

    def close(self) -> None:
        # TCPStore has no close(); dropping the last reference stops its server thread.
        self._store = None
