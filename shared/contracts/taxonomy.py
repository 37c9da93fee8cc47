"""Failure taxonomy of docs/design.md §3: what kinds of fault exist, how bad each is, what to do.

The table is the single source for severity and action; the trainer's exception classifier,
the agent's supervision and the detector all name categories from here. Which transition
answers each action, and which plan action carries it out, is the map of
:mod:`unicron.shared.contracts.transitions`.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum


class Severity(str, Enum):
    SEV1 = "SEV1"
    SEV2 = "SEV2"
    SEV3 = "SEV3"


class RecoveryAction(str, Enum):
    """What a failure calls for; a failed action escalates REATTEMPT → RESTART → RECONFIGURE."""

    REATTEMPT = "reattempt"
    RESTART = "restart"
    RECONFIGURE = "reconfigure"
    # Recorded and counted against the node, but the job keeps running (e.g. a straggler).
    REPORT = "report"


class FailureKind(str, Enum):
    """How the fault was observed."""

    CRASH = "crash"  # killed by a signal
    EXIT = "exit"  # exited with a non-zero code and no in-band report
    EXCEPTION = "exception"  # reported in-band by the worker runtime
    HANG = "hang"
    NODE_LOST = "node_lost"
    STRAGGLER = "straggler"
    # seen by the node's own GPU health watch (NVML), not in a worker: the fault is the node's
    HARDWARE = "hardware"


class FailureCategory(str, Enum):
    NCCL_TIMEOUT = "nccl_timeout"
    NCCL_ERROR = "nccl_error"
    ECC = "ecc"
    NVLINK = "nvlink"
    INVALID_DMA = "invalid_dma"
    ILLEGAL_MEMORY = "illegal_memory"
    CUDA_ERROR = "cuda_error"
    GPU_DRIVER = "gpu_driver"
    OOM = "oom"
    CONNECTION_REFUSED = "connection_refused"
    CONNECTION_RESET = "connection_reset"
    LINK_FLAPPING = "link_flapping"
    NETWORK_OTHER = "network_other"
    NAN_LOSS = "nan_loss"
    # The ranks disagree on a collective (its op, size or order), or the communication library
    # says it was used wrongly: the job's code or its checkpoint, never the node it ran on.
    COLLECTIVE_MISMATCH = "collective_mismatch"
    SOFTWARE_OTHER = "software_other"
    EXITED_ABNORMALLY = "exited_abnormally"
    TASK_HANG = "task_hang"
    NODE_DOWN = "node_down"
    STRAGGLER = "straggler"


_SEV1 = (Severity.SEV1, RecoveryAction.RECONFIGURE)
_SEV2 = (Severity.SEV2, RecoveryAction.RESTART)
_SEV3 = (Severity.SEV3, RecoveryAction.REATTEMPT)
_ADVISORY = (Severity.SEV3, RecoveryAction.REPORT)

SEVERITY_TABLE: dict[FailureCategory, tuple[Severity, RecoveryAction]] = {
    FailureCategory.NODE_DOWN: _SEV1,
    FailureCategory.ECC: _SEV1,
    FailureCategory.INVALID_DMA: _SEV1,
    FailureCategory.NVLINK: _SEV1,
    FailureCategory.GPU_DRIVER: _SEV1,
    FailureCategory.EXITED_ABNORMALLY: _SEV2,
    FailureCategory.ILLEGAL_MEMORY: _SEV2,
    FailureCategory.CUDA_ERROR: _SEV2,
    FailureCategory.TASK_HANG: _SEV2,
    FailureCategory.NCCL_TIMEOUT: _SEV2,
    FailureCategory.NCCL_ERROR: _SEV2,
    FailureCategory.OOM: _SEV2,
    FailureCategory.NAN_LOSS: _SEV2,
    FailureCategory.COLLECTIVE_MISMATCH: _SEV2,
    FailureCategory.SOFTWARE_OTHER: _SEV2,
    FailureCategory.CONNECTION_REFUSED: _SEV3,
    FailureCategory.CONNECTION_RESET: _SEV3,
    FailureCategory.LINK_FLAPPING: _SEV3,
    FailureCategory.NETWORK_OTHER: _SEV3,
    FailureCategory.STRAGGLER: _ADVISORY,
}

# An action that fails again escalates one level up this ladder (docs/design.md §3).
ESCALATION: tuple[tuple[Severity, RecoveryAction], ...] = (_SEV3, _SEV2, _SEV1)

# A failure of the job itself (its code's, or one that followed it to other nodes) is answered
# by restarting it where it runs, counted toward its ``max_restarts``: moving it would not help.
JOBS_FAULT = _SEV2

_USERS_CODE = frozenset({FailureCategory.SOFTWARE_OTHER, FailureCategory.COLLECTIVE_MISMATCH})


def escalate(previous: RecoveryAction, current: RecoveryAction) -> tuple[Severity, RecoveryAction]:
    """The level above the higher of two failed actions; the top level stays the top."""
    levels = [action for _, action in ESCALATION]
    rank = max(levels.index(previous), levels.index(current))
    return ESCALATION[min(rank + 1, len(ESCALATION) - 1)]


def severity_of(category: FailureCategory) -> tuple[Severity, RecoveryAction]:
    return SEVERITY_TABLE[category]


def users_code(category: FailureCategory) -> bool:
    """A failure of the job's own code: it counts toward ``max_restarts``, never against a node,
    and never escalates (the same code fails the same way on any node)."""
    return category in _USERS_CODE


def nodes_own(category: FailureCategory) -> bool:
    """A fault of the node itself (its hardware, or the node gone): never the job's, however
    often it recurs. By the category's own severity, not a failure's escalated one."""
    return SEVERITY_TABLE[category][0] == Severity.SEV1


# Signals a process raises on itself for a fault in its own code (a bad pointer, abort() on an
# uncaught C++ exception, a bad instruction or division). Any other came from outside the job:
# SIGKILL from the OOM killer or an operator, SIGTERM from a scheduler.
CODE_SIGNALS: dict[int, str] = {
    signal.SIGSEGV: "a segmentation fault",
    signal.SIGABRT: "an abort",
    signal.SIGBUS: "a bus error",
    signal.SIGFPE: "an arithmetic fault",
    signal.SIGILL: "an illegal instruction",
}
_OUTSIDE: dict[int, str] = {signal.SIGKILL: "the OOM killer or an operator"}


@dataclass(frozen=True)
class SignalDeath:
    """What a worker killed by a signal is reported as: the signal's name and a sentence."""

    name: str
    category: FailureCategory
    message: str


def signal_death(signum: int) -> SignalDeath:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if signum in CODE_SIGNALS:
        why = f"{CODE_SIGNALS[signum]} in the job's code"
        return SignalDeath(name, FailureCategory.SOFTWARE_OTHER, f"killed by {name} ({why})")
    why = _OUTSIDE.get(signum, "from outside the job")
    return SignalDeath(name, FailureCategory.EXITED_ABNORMALLY, f"killed by {name} ({why})")
