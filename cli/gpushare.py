"""How ``unicron up`` and ``unicron demo`` share one host's GPUs among the node agents they start.

An agent takes every GPU it can see (``services/agent/gpus.py``), so agents started side by side
on one host with the same devices would put two ranks on one GPU, which NCCL refuses ("Duplicate
GPU detected"). Each agent is therefore given its own contiguous share through
``CUDA_VISIBLE_DEVICES`` (the first ones one more where the split is uneven) and, unless
``--slots`` says fewer, one slot per GPU of its share. With fewer GPUs than agents no split gives
every rank a GPU of its own: the GPUs are hidden and the workers run on the CPU, and the operator
is told so and how to train on the GPUs instead (one agent per GPU). On a host without GPUs the
agents run ``--slots`` workers each (:data:`CPU_SLOTS` by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from unicron.services.agent.gpus import CPU_SLOTS


class GpuShareError(ValueError):
    """``--slots`` asks each agent for more workers than it has GPUs."""


@dataclass(frozen=True)
class GpuShare:
    """Each agent's additions to its environment, in node order, and a line for the operator
    (None where there is nothing to say: no GPUs)."""

    envs: list[dict[str, str]]
    note: str | None = None


def share_gpus(devices: Sequence[str], nodes: int, slots: int | None) -> GpuShare:
    """Split the host's ``devices`` among ``nodes`` agents of ``slots`` slots each (None: the
    default). Raises GpuShareError where an agent's share is smaller than ``slots``."""
    gpus = len(devices)
    if not gpus:
        return GpuShare([{"UNICRON_SLOTS": str(slots or CPU_SLOTS)}] * nodes)
    if gpus < nodes:
        note = (
            f"{nodes} node agents and {gpus} GPU(s): each rank needs a GPU of its own (NCCL "
            f"refuses two on one device), so the workers run on the CPU; start {gpus} node "
            f"agent(s) (--nodes {gpus}) to train on the GPUs"
        )
        hidden = {"CUDA_VISIBLE_DEVICES": "", "UNICRON_SLOTS": str(slots or CPU_SLOTS)}
        return GpuShare([hidden] * nodes, note)
    shares = _split(list(devices), nodes)
    smallest = min(len(share) for share in shares)
    if slots is not None and slots > smallest:
        raise GpuShareError(
            f"--slots {slots} is more than the {smallest} GPU(s) an agent gets when {nodes} "
            f"agents share this host's {gpus}: each worker needs a GPU of its own; ask for "
            f"--slots {smallest} or fewer, or fewer --nodes"
        )
    envs = [
        {"CUDA_VISIBLE_DEVICES": ",".join(share), "UNICRON_SLOTS": str(slots or len(share))}
        for share in shares
    ]
    split = "; ".join(f"node-{i}: {','.join(share)}" for i, share in enumerate(shares))
    return GpuShare(envs, f"{gpus} GPU(s) shared among {nodes} node agent(s): {split}")


def _split(devices: list[str], nodes: int) -> list[list[str]]:
    base, extra = divmod(len(devices), nodes)
    shares, start = [], 0
    for index in range(nodes):
        size = base + (1 if index < extra else 0)
        shares.append(devices[start : start + size])
        start += size
    return shares
