"""GPU slots: one rank per GPU. Each live worker gets one CUDA device of its own through
``CUDA_VISIBLE_DEVICES``; no two workers ever share one, since NCCL refuses two ranks on one
device of one host ("Duplicate GPU detected").

Slot ``i`` is the ``i``-th device the agent itself may use (its own ``CUDA_VISIBLE_DEVICES``
when it has one, so a node that hands the agent a subset keeps to it). On a GPU node the node
has one slot per device unless ``UNICRON_SLOTS`` asks for fewer (then the first devices are its
slots); asking for more is refused at start (:func:`node_slots`). A worker takes the lowest free
slot and gives it back when it exits; a start that finds every device held is refused
(:class:`NoFreeGPUError`), never shared. On a node without CUDA there are no devices, the node
has ``UNICRON_SLOTS`` slots (:data:`CPU_SLOTS` by default) and the workers' environment is left
alone.

A GPU that NVML reports faulty (SEV1) is retired from the slots until the agent restarts, as
NVIDIA's device plugin marks a device unhealthy: no later start is handed it, and the node
registers one slot fewer. :meth:`SlotPool.place` tells which of the agent's devices an NVML GPU
is: by UUID, or by index where CUDA numbers the devices in PCI order as NVML does (the agent
sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` unless the operator chose an order).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

CPU_SLOTS = 2  # a node without GPUs: the demo runs two workers on each


class SlotsError(ValueError):
    """``UNICRON_SLOTS`` asks for more slots than the node has GPUs: no retry helps."""


class NoFreeGPUError(RuntimeError):
    """Every GPU slot of the node is held: a start must not share a device."""


def visible_devices() -> list[str]:
    """The devices this agent may hand out, as ``CUDA_VISIBLE_DEVICES`` entries; [] on CPU."""
    # torch is imported here, not at module level: it costs ~2 s and only this needs it
    import torch

    # before CUDA starts: it then numbers devices as NVML does, so an NVML index names one
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if inherited:
        return [d.strip() for d in inherited.split(",") if d.strip()][:count]
    return [str(i) for i in range(count)]


def node_slots(asked: int | None, devices: Sequence[str]) -> int:
    """The node's slots: ``asked`` (``UNICRON_SLOTS``) when set, else one per GPU, or
    :data:`CPU_SLOTS` without GPUs. Raises SlotsError when a GPU node is asked for more."""
    gpus = len(devices)
    if not gpus:
        return CPU_SLOTS if asked is None else asked
    if asked is None:
        return gpus
    if asked > gpus:
        raise SlotsError(
            f"UNICRON_SLOTS={asked} is more than the {gpus} GPU(s) this node has "
            f"({','.join(devices)}): each worker needs a GPU of its own (NCCL refuses two ranks "
            f"on one device); set UNICRON_SLOTS to {gpus} or fewer, or unset it for one per GPU"
        )
    return asked


def names_gpu(entry: str, index: int | None, uuid: str | None) -> bool | None:
    """Whether the ``CUDA_VISIBLE_DEVICES`` entry is the NVML GPU (``index``, ``uuid``); None
    where that cannot be told (a MIG instance, an index under another CUDA device order)."""
    if entry.startswith("GPU-"):  # CUDA takes a UUID or any unique prefix of one
        return None if uuid is None else uuid.startswith(entry)
    if entry.isdigit() and os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
        return None if index is None else int(entry) == index
    return None


@dataclass(frozen=True)
class GpuPlace:
    """Where an NVML GPU is among the agent's devices: ``known`` False where it cannot be told;
    else ``ours`` whether the agent may use it, and ``slot`` the slot it is (None: no slot)."""

    known: bool
    ours: bool = False
    slot: int | None = None


class SlotPool:
    def __init__(self, devices: Sequence[str] = (), slots: int | None = None) -> None:
        self.devices: list[str] = []  # the devices the slots hand out, slot i the i-th
        self.found: list[str] = []  # every device the agent may use, slots or not
        self.gpus = 0  # the GPUs the agent found (more than ``devices`` if it was asked fewer)
        self._slots = 0  # the node's slots as found, retired ones included
        self._taken: set[int] = set()
        self.retired: dict[int, str] = {}  # faulty slots, never handed out again: why
        self.use(devices, slots)

    def use(self, devices: Sequence[str], slots: int | None = None) -> None:
        """The devices the agent found once it ran, and ``UNICRON_SLOTS``: before any worker or
        spare took a slot. Raises SlotsError for more slots than devices on a GPU node."""
        self._slots = node_slots(slots, devices)
        self.gpus = len(devices)
        self.found = list(devices)
        self.devices = list(devices[: self._slots])
        self.retired.clear()

    @property
    def count(self) -> int:
        """The node's slots: what it registers and the planner fills (a retired GPU is none)."""
        return self._slots - len(self.retired)

    def acquire(self) -> int | None:
        """The lowest free slot, or None on a node without GPUs (nothing to hand out). Raises
        NoFreeGPUError when every GPU slot is held: the plan placed one rank too many here."""
        if not self.gpus:
            return None
        out = self._taken | self.retired.keys()
        slot = next((i for i in range(len(self.devices)) if i not in out), None)
        if slot is None:
            raise NoFreeGPUError(f"all {len(self.devices)} GPU slots are held{self._why_out()}")
        self._taken.add(slot)
        return slot

    def free(self) -> int:
        """Healthy devices no worker (or spare) holds."""
        return len(self.devices) - len(self._taken | self.retired.keys())

    def release(self, slot: int | None) -> None:
        if slot is not None:
            self._taken.discard(slot)

    def env(self, slot: int | None) -> dict[str, str]:
        """What to add to the worker's environment for ``slot``: exactly its one device."""
        if slot is None:
            return {}
        return {"CUDA_VISIBLE_DEVICES": self.devices[slot]}

    def place(self, index: int | None, uuid: str | None) -> GpuPlace:
        """Which of the agent's devices the NVML GPU (``index``, ``uuid``) is."""
        for position, entry in enumerate(self.found):
            named = names_gpu(entry, index, uuid)
            if named is None:
                return GpuPlace(known=False)
            if named:
                slot = position if position < len(self.devices) else None
                return GpuPlace(known=True, ours=True, slot=slot)
        # none of the agent's devices: not its GPU; with no devices found (CUDA absent but NVML
        # present) it cannot be told which workers use it
        return GpuPlace(known=bool(self.found))

    def retire(self, slot: int, why: str) -> None:
        """Hand ``slot`` out no more (its GPU is faulty): the node counts one slot fewer."""
        self.retired.setdefault(slot, why)

    def retired_devices(self) -> dict[str, str]:
        """The retired GPUs by device, with their faults: what the node's record shows."""
        return {self.devices[slot]: why for slot, why in sorted(self.retired.items())}

    def describe(self) -> str:
        """The node's GPU slots in a few words, for a refused start."""
        text = f"{len(self.devices)} GPU(s)"
        if self.gpus > len(self.devices):
            text += f" as slots (UNICRON_SLOTS={len(self.devices)} of its {self.gpus})"
        return text + self._why_out()

    def _why_out(self) -> str:
        retired = ", ".join(f"{device}: {why}" for device, why in self.retired_devices().items())
        return f" (retired as faulty: {retired})" if retired else ""
