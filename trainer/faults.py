"""Fault drills inside a worker: make this rank fail the way real ranks fail.

The agent forwards a ``FaultDirective`` (:mod:`unicron.shared.contracts.workerchannel`) over the
local channel. The channel's reader thread hands its ``FaultSpec`` to :class:`FaultInbox`, which
only parks it; the training thread asks the inbox at the start of each step's compute and fires
what is due there, so a fault always strikes at a step boundary of the training thread:

- crash: SIGKILL to itself — no report, like a process the kernel or a segfault took;
- exit: ``os._exit(exit_code)`` without flushing the channel — a silent exit;
- exception: ``RuntimeError(message)`` raised inside the step, so it is caught, classified and
  reported like a real fault (inject real NCCL or CUDA text to drill the classifier);
- hang: blocks inside the compute phase forever, while peers wait in the collective;
- slow: from that step on this rank's compute takes ``slowdown`` times as long.
"""

from __future__ import annotations

import os
import signal
import threading

from unicron.shared.contracts.messages import FaultKind, FaultSpec
from unicron.shared.logging import get_logger

log = get_logger(component="unicron.trainer.faults")


class FaultInbox:
    """Fault directives from the agent, parked until the training thread reaches their step."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._lock = threading.Lock()
        self._armed: list[FaultSpec] = []

    def offer(self, fault: FaultSpec) -> None:
        """Arm one fault (runs on the channel's reader thread); never raises."""
        if fault.rank != self.rank:
            # Misrouted: striking the wrong rank would make a drill report a false culprit.
            log.warning("fault for another rank ignored", fault_rank=fault.rank, rank=self.rank)
            return
        with self._lock:
            self._armed.append(fault)
        log.info("fault armed", kind=fault.kind.value, at_step=fault.at_step)

    def due(self, step: int) -> list[FaultSpec]:
        """Faults to fire at ``step``: those for it, for no step in particular (the next one),
        or for a step already passed when the directive arrived (late is better than never)."""
        # An unlocked look at the list first: the common case, nothing armed, costs one read.
        if not self._armed:
            return []
        due: list[FaultSpec] = []
        later: list[FaultSpec] = []
        with self._lock:
            for fault in self._armed:
                (due if fault.at_step is None or fault.at_step <= step else later).append(fault)
            self._armed = later
        return due


class FaultInjector:
    """Fires due faults in the training thread and remembers a standing slowdown."""

    def __init__(self) -> None:
        self.slowdown = 1.0

    def fire(self, fault: FaultSpec, step: int) -> None:
        log.warning("fault injected", kind=fault.kind.value, step=step)
        if fault.kind is FaultKind.CRASH:
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind is FaultKind.EXIT:
            os._exit(fault.exit_code)
        elif fault.kind is FaultKind.EXCEPTION:
            raise RuntimeError(fault.message)
        elif fault.kind is FaultKind.HANG:
            threading.Event().wait()  # nothing sets it: stuck in compute until killed
        elif fault.kind is FaultKind.SLOW:
            self.slowdown = fault.slowdown
