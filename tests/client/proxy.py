"""A TCP proxy in front of the API whose open connections a test can cut, as a load balancer
or a restarted ingress would, while it goes on accepting new ones."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

COPY_BYTES = 65536


class Proxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.open: set[asyncio.StreamWriter] = set()
        self.connections = 0

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(COPY_BYTES):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self.open |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self.open -= {writer, up_writer}

    def cut(self) -> None:
        """Drop every connection open now, both ways."""
        for writer in list(self.open):
            writer.transport.abort()


@asynccontextmanager
async def proxy_to(upstream: str) -> AsyncIterator[tuple[str, Proxy]]:
    """``(url, proxy)`` of a proxy to ``upstream`` on a free port, until the block ends."""
    proxy = Proxy(upstream)
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", proxy
    finally:
        proxy.cut()
        server.close()
