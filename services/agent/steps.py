"""Step telemetry leaves the node once per step, not once per rank.

Every rank reports each step to its agent. Forwarded one by one, a cluster of 16,384 ranks
would put 16,384 messages per step through JetStream and each of three consumers
(``bench/scale.py``). The batcher holds a step report until every rank the node runs of that
job's generation has reported, or ``window_s`` has passed since the first, and sends them in one
``StepsCompleted``. Ranks of one job step together, so the wait is a few milliseconds; a rank
that lags (a straggler) delays the message by ``window_s`` at most.

Any other report goes out at once, after the held steps: a rank's last step must reach the
control plane before its exit does, or the finished job would keep the step before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from unicron.services.agent.api import Report
from unicron.shared.contracts.reports import AnyReport, StepCompleted, StepsCompleted

WINDOW_S = 0.02
# The ranks of a job's generation this node runs now.
LocalRanks = Callable[[str, int], int]
_Key = tuple[str, int]  # (job, generation)


class ReportOut(Protocol):
    """Where batches and everything else go: the agent's outbox."""

    def report(self, report: AnyReport) -> None: ...

    def dead_letter(self, subject: str, payload: bytes, reason: str) -> None: ...


class StepBatcher:
    """A :class:`unicron.services.agent.api.Sink` in front of the outbox."""

    def __init__(self, out: ReportOut, local_ranks: LocalRanks, window_s: float = WINDOW_S):
        self.out = out
        self.local_ranks = local_ranks
        self.window_s = window_s
        self._held: dict[_Key, list[StepCompleted]] = {}

    def report(self, report: Report) -> None:
        if not isinstance(report, StepCompleted):
            self.flush()
            self.out.report(report)
            return
        key = (report.job_id, report.generation)
        held = self._held.get(key)
        if held is not None and any(s.rank == report.rank for s in held):
            self._send(key)  # the rank is a step ahead of the others: its last one goes first
            held = None
        if held is None:
            held = self._held[key] = []
            asyncio.get_running_loop().call_later(self.window_s, self._send, key, held)
        held.append(report)
        if len(held) >= self.local_ranks(*key):
            self._send(key)

    def dead_letter(self, subject: str, payload: bytes, reason: str) -> None:
        self.out.dead_letter(subject, payload, reason)

    def flush(self) -> None:
        for key in list(self._held):
            self._send(key)

    def _send(self, key: _Key, only: list[StepCompleted] | None = None) -> None:
        """Send the steps held for ``key`` (if they are still ``only``: the window's timer)."""
        held = self._held.get(key)
        if held is None or (only is not None and held is not only):
            return
        del self._held[key]
        self.out.report(StepsCompleted.of(held))
