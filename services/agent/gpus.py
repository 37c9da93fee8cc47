"""GPU slots: each live worker gets one CUDA device of its own through ``CUDA_VISIBLE_DEVICES``.

Slot ``i`` is the ``i``-th device the agent itself may use (its own ``CUDA_VISIBLE_DEVICES``
when it has one, so a node that hands the agent a subset keeps to it). A worker takes the
lowest free slot and gives it back when it exits. On a node without CUDA there are no devices
and the workers' environment is left alone.
"""

from __future__ import annotations

import os

from unicron.shared.logging import get_logger

log = get_logger(component="gpus")


def visible_devices() -> list[str]:
    """The devices this agent may hand out, as ``CUDA_VISIBLE_DEVICES`` entries; [] on CPU."""
    # torch is imported here, not at module level: it costs ~2 s and only this needs it
    import torch

    if not torch.cuda.is_available():
        return []
    count = torch.cuda.device_count()
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if inherited:
        return [d.strip() for d in inherited.split(",") if d.strip()][:count]
    return [str(i) for i in range(count)]


class SlotPool:
    def __init__(self, devices: list[str] | None = None) -> None:
        self.devices = devices or []
        self._taken: set[int] = set()

    def use(self, devices: list[str]) -> None:
        """The devices the agent found once it ran: before any worker or spare took a slot."""
        self.devices = devices

    def acquire(self) -> int | None:
        """The lowest free slot, or None on a node without devices."""
        if not self.devices:
            return None
        slot = next(i for i in range(len(self._taken) + 1) if i not in self._taken)
        if slot >= len(self.devices):
            # the plan is the authority on slots: share a device rather than refuse the worker
            log.warning("more workers than devices; sharing one", slot=slot)
        self._taken.add(slot)
        return slot

    def free(self) -> int:
        """Devices no worker (or spare) holds."""
        return max(0, len(self.devices) - len(self._taken))

    def release(self, slot: int | None) -> None:
        if slot is not None:
            self._taken.discard(slot)

    def env(self, slot: int | None) -> dict[str, str]:
        """What to add to the worker's environment for ``slot``."""
        if slot is None:
            return {}
        return {"CUDA_VISIBLE_DEVICES": self.devices[slot % len(self.devices)]}
