"""The node's rendezvous store: one TCPStore hosted by the agent for the node's whole life.

Workers of every generation meet in it under a per-generation prefix, so a rendezvous
outlives any worker that dies (docs/design.md §5). The agent binds the listening socket itself and
hands it to torch, so the store listens on the configured address only — TCPStore alone would
listen on every interface.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING

from unicron.shared.logging import get_logger

if TYPE_CHECKING:
    # torch defines TCPStore in a C extension and does not list it in torch.distributed's
    # exports, hence the ignores on both imports.
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

log = get_logger(component="store")


def _listen(host: str, port: int) -> socket.socket:
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


def host_store(host: str, bind_host: str, port: int) -> TCPStore:
    # torch is imported here, not at module level: it costs ~2 s and only this needs it.
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    sock = _listen(bind_host, port)
    try:
        store = TCPStore(
            host,
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
    def __init__(self, host: str, port: int = 0, bind_host: str | None = None) -> None:
        self.host = host
        self.bind_host = bind_host or host
        self.requested_port = port
        self._store: TCPStore | None = None

    @property
    def port(self) -> int:
        if self._store is None:
            raise RuntimeError("store not started")
        return int(self._store.port)

    async def start(self) -> int:
        """Host the store (in a thread: importing torch and binding block) and return its port."""
        self._store = await asyncio.to_thread(
            host_store, self.host, self.bind_host, self.requested_port
        )
        log.info("rendezvous store listening", host=self.bind_host, port=self.port)
        return self.port

    def close(self) -> None:
        # TCPStore has no close(); dropping the last reference stops its server thread.
        self._store = None
