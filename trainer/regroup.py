"""Regroup directives waiting for the training thread, and when a worker may wait for one.

The agent hands a worker a ``RegroupDirective`` (:mod:`unicron.shared.contracts.workerchannel`) over
the local channel to re-form its process group in place under a new generation (docs/design.md §5).
The channel's reader thread parks it here; the training thread looks between micro-batches
(:meth:`RegroupInbox.pending` is one unlocked read) and applies it at once, or waits for one
while *parked* after a peer failure. Only the newest generation above the current one is
kept: a stale or repeated directive is dropped, so the agent may resend freely.

A worker parks — keeps its model, optimizer and partial step in memory instead of exiting —
only when a *collective* failed the way a lost peer makes it fail (closed or reset
connection, timeout, unreachable store). A fault of its own (CUDA, ECC, NaN, a software
error in its compute) still ends the process: its memory is not to be trusted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from unicron.shared.contracts.messages import RegroupDirective
from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.shared.logging import get_logger
from unicron.trainer.classify import classify
from unicron.trainer.sever import sever

log = get_logger(component="unicron.trainer.regroup")

# What a collective raises when a peer died or the network between them broke.
PEER_FAILURES = frozenset(
    {
        FailureCategory.CONNECTION_RESET,
        FailureCategory.CONNECTION_REFUSED,
        FailureCategory.NETWORK_OTHER,
        FailureCategory.NCCL_TIMEOUT,
        FailureCategory.LINK_FLAPPING,
    }
)


def is_peer_failure(exc: BaseException) -> bool:
    return classify(exc) in PEER_FAILURES


@dataclass(frozen=True)
class PendingRegroup:
    directive: RegroupDirective
    received: float  # time.perf_counter() when the line arrived: regroup_s starts here


class RegroupInbox:
    """The newest regroup directive for this worker, until the training thread takes it."""

    def __init__(self, job_id: str, generation: int) -> None:
        self.job_id = job_id
        self.generation = generation
        self._cond = threading.Condition()
        self._pending: PendingRegroup | None = None
        # Frees a collective blocked on the old group (NCCL's abort, trainer/comm.py).
        self.interrupt: Callable[[], None] | None = None

    def offer(self, regroup: RegroupDirective) -> None:
        """Keep ``regroup`` if it is newer than what this worker has (reader thread)."""
        received = time.perf_counter()
        with self._cond:
            newest = self._pending.directive.generation if self._pending else self.generation
            if regroup.job_id != self.job_id or regroup.generation <= newest:
                log.info("stale regroup directive ignored", generation=regroup.generation)
                return
            self._pending = PendingRegroup(regroup, received)
            self._cond.notify_all()
        log.info("regroup directive", generation=regroup.generation, rank=regroup.rank)
        # After the directive is pending: a collective that fails now parks and finds it.
        sever(regroup.lost_hosts)
        if self.interrupt is not None:
            self.interrupt()

    def pending(self) -> bool:
        return self._pending is not None

    def take(self) -> PendingRegroup | None:
        with self._cond:
            pending, self._pending = self._pending, None
            if pending is not None:
                self.generation = pending.directive.generation
            return pending

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a directive; True once one is pending."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is not None, timeout_s)
