"""Settings of the API service (``UNICRON_API_*`` and the common ``UNICRON_*`` variables)."""

from __future__ import annotations

import ipaddress

from shared.settings import CommonSettings


class ApiSettings(CommonSettings):
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    # A non-loopback bind without tokens exposes job control to the network; the operator must
    # say so explicitly until bearer tokens exist.
    api_allow_unauthenticated_bind: bool = False
    # Proxies and load balancers drop idle connections after 30-60 s; a ping every 15 s keeps
    # an SSE stream open and lets the server notice clients that went away.
    api_sse_ping_s: float = 15.0
    # How long the lifespan retries NATS and Redis before the service gives up starting.
    api_connect_timeout_s: float = 30.0

    @property
    def loopback_only(self) -> bool:
        if self.api_host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.api_host).is_loopback
        except ValueError:  # a host name other than localhost may resolve anywhere
            return False
