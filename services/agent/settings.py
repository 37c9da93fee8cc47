"""Settings of the node agent, from ``UNICRON_*`` environment variables.

``UNICRON_NODE_ID`` names the node on the bus and in Redis, ``UNICRON_SLOTS`` is how many
workers it may run (on a GPU node one per GPU by default and at most that: the agent checks it
once it found its GPUs, ``unicron.services.agent.gpus``), ``UNICRON_HOST`` is the address peers
use to reach its rendezvous store (unset: the local address of the route to NATS,
``unicron.services.agent.address``) and
``UNICRON_STORE_PORT`` that store's port (0: any free port), or ``UNICRON_STORE_PORTS=LO-HI``
a range for it and the entrypoint jobs' master stores to take the first free ports of, for a
firewall that opens only those. ``UNICRON_ENTRYPOINTS`` (JSON)
registers extra trainer entrypoints for this node only; the bus can never add one.
``UNICRON_SPARE_MODULE`` is what a warm spare runs (``python -m MODULE``): any module that waits
for a launch as ``unicron.trainer.spare`` does, say one that imports a site's own libraries first.
``UNICRON_HANG_*`` tune hang detection (``unicron.services.agent.hang``).
``UNICRON_GPU_HEALTH_S`` is how often the GPU health watch reads NVML's counters
(``unicron.services.agent.gpuhealth``).
"""

from __future__ import annotations

import re
import socket

from pydantic import Field, field_validator, model_validator
from unicron.services.agent.registry import MODULE_PATH
from unicron.shared.settings import CommonSettings

# A node id is one NATS subject token and part of Redis keys: no dots, wildcards or spaces.
_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def default_node_id() -> str:
    """The host name made into a valid node id (dots would split the NATS subject)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()).strip("-_")
    return name or "node"


class AgentSettings(CommonSettings):
    metrics_port: int = Field(9104, ge=0, le=65535)  # /metrics (0: off)
    node_id: str = Field(default_factory=default_node_id)
    slots: int | None = Field(
        None, ge=0, description="workers at once; default: one per GPU, or 2 on a CPU node"
    )
    host: str | None = Field(
        None, description="address peers reach this node at; default: the route to NATS"
    )
    store_port: int = Field(0, ge=0, le=65535)
    store_ports: str | None = Field(
        None, description="LO-HI: the stores take the first free ports in it; default: any"
    )
    store_bind_host: str | None = Field(
        None, description="address the stores listen on; default: host"
    )
    entrypoints: dict[str, str] = Field(
        default_factory=dict, description="extra trainer name → python module for this node"
    )
    stop_wait_s: float = Field(5.0, gt=0, description="how long to wait for killed workers")
    spares: int | None = Field(
        None,
        ge=0,
        description="warm interpreters to keep (~0.4 GB RAM each, no GPU); default one per slot",
    )
    spare_module: str = Field(
        "unicron.trainer.spare",
        pattern=MODULE_PATH,
        description="what a warm spare runs; it runs whichever trainer each launch names",
    )
    spare_delay_s: float = Field(
        2.0, ge=0, description="wait after a spare served a start before starting the next one"
    )
    # a plain script's checkpoint directory follows its job (unicron.services.agent.mirror)
    checkpoint_url: str | None = Field(
        None, description="object storage for snapshots (any fsspec URL); default: the bus"
    )
    checkpoint_mirror_s: float = Field(
        5.0, ge=0, description="how often rank 0's checkpoint directory is looked at; 0: never"
    )
    checkpoint_mirror_max_bytes: int = Field(
        2 * 1024**3, gt=0, description="the largest snapshot sent over the bus (not to a URL)"
    )
    # GPU health through NVML, the `gpu` extra (unicron.services.agent.gpuhealth)
    gpu_health_s: float = Field(
        5.0, ge=0, description="how often the GPUs' error counters are read; 0: no GPU watch"
    )

    # hang detection: no step for max(factor x mean, mean + margin) is a hang (docs/design.md §3)
    hang_factor: float = Field(3.0, gt=1.0, description="threshold in running-mean step times")
    hang_margin_s: float = Field(
        0.5, ge=0, description="least slack over the mean, for short steps and scheduling noise"
    )
    hang_window: int = Field(20, ge=1, description="steps in the running median")
    hang_jitter_factor: float = Field(
        1.5, ge=1.0, description="threshold at least this many times the longest recent gap"
    )
    hang_startup_s: float = Field(60.0, gt=0, description="floor before the first step")
    hang_warmup_s: float = Field(10.0, gt=0, description="floor until hang_warmup_steps")
    hang_warmup_steps: int = Field(5, ge=0, description="steps seen before the floor lifts")
    hang_checkpoint_s: float = Field(
        60.0, gt=0, description="floor while the worker says it writes a checkpoint"
    )
    hang_check_interval_s: float = Field(0.05, gt=0, le=5.0, description="how often to check")

    @property
    def store_port_choice(self) -> int | range:
        """The range ``UNICRON_STORE_PORTS`` allows, else ``UNICRON_STORE_PORT`` (0: any)."""
        if self.store_ports is None:
            return self.store_port
        low, high = _port_range(self.store_ports)
        return range(low, high + 1)

    @field_validator("node_id")
    @classmethod
    def _valid_node_id(cls, value: str) -> str:
        if not _NODE_ID.match(value):
            raise ValueError("node_id must be letters, digits, '_' or '-' (no dots)")
        return value

    @field_validator("store_ports")
    @classmethod
    def _valid_store_ports(cls, value: str | None) -> str | None:
        if value is None:
            return None
        low, high = _port_range(value)
        return f"{low}-{high}"

    @model_validator(mode="after")
    def _one_way_to_pick_the_port(self) -> AgentSettings:
        if self.store_ports is not None and "store_port" in self.model_fields_set:
            raise ValueError(
                "UNICRON_STORE_PORT and UNICRON_STORE_PORTS are both set: set one port or one range"
            )
        return self


def _port_range(text: str) -> tuple[int, int]:
    """``LO-HI`` as two ports, 1 <= LO <= HI <= 65535."""
    match = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", text)
    if match is None:
        raise ValueError(f"UNICRON_STORE_PORTS={text!r} is not a range LO-HI, e.g. 29500-29599")
    low, high = int(match[1]), int(match[2])
    if not 1 <= low <= high <= 65535:
        raise ValueError(
            f"UNICRON_STORE_PORTS={text!r}: want 1 <= LO <= HI <= 65535, e.g. 29500-29599"
        )
    return low, high
