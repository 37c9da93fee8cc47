"""A webhook receiver for the tests: a real HTTP server on a port of its own that records every
POST, answers the status it is told to, and can go down (connections refused) and come back on
the same port."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from unicron.shared.procs import free_port


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def event_id(self) -> str:
        return self.headers["x-unicron-event-id"]

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(self, status: int = 200) -> None:
        self.port = free_port()
        self.status = status
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def event_ids(self) -> list[str]:
        return [r.event_id for r in self.snapshot()]

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                if 200 <= receiver.status < 300:  # a receiver records what it accepted
                    with receiver._lock:
                        receiver.received.append(Received(headers, body))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        """Stop listening: every connection is refused until :meth:`up`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
