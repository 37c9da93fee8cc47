"""Settings of the node agent, from ``UNICRON_*`` environment variables.

``UNICRON_NODE_ID`` names the node on the bus and in Redis, ``UNICRON_SLOTS`` is how many
workers it may run, ``UNICRON_HOST`` is the address peers use to reach its rendezvous store and
``UNICRON_STORE_PORT`` that store's port (0: any free port). ``UNICRON_ENTRYPOINTS`` (JSON)
registers extra trainer entrypoints for this node only; the bus can never add one.
"""

from __future__ import annotations

import re
import socket

from pydantic import Field, field_validator

from shared.settings import CommonSettings

# A node id is one NATS subject token and part of Redis keys: no dots, wildcards or spaces.
_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def default_node_id() -> str:
    """The host name made into a valid node id (dots would split the NATS subject)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()).strip("-_")
    return name or "node"


class AgentSettings(CommonSettings):
    node_id: str = Field(default_factory=default_node_id)
    slots: int = Field(2, ge=0)
    host: str = "127.0.0.1"
    store_port: int = Field(0, ge=0, le=65535)
    store_bind_host: str | None = Field(
        None, description="address the rendezvous store listens on; default: host"
    )
    entrypoints: dict[str, str] = Field(
        default_factory=dict, description="extra trainer name → python module for this node"
    )
    stop_wait_s: float = Field(5.0, gt=0, description="how long to wait for killed workers")

    @field_validator("node_id")
    @classmethod
    def _valid_node_id(cls, value: str) -> str:
        if not _NODE_ID.match(value):
            raise ValueError("node_id must be letters, digits, '_' or '-' (no dots)")
        return value
