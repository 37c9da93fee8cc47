"""Fail-slow detection: a rank persistently slower than its peers, from per-step telemetry.

Synchronous data parallelism makes every rank's iteration time equal (all wait in the
all-reduce), so ranks are compared on their own compute time (``StepCompleted.compute_s``).
Medians over a window of recent steps and a streak of consecutive verdicts keep a shared
machine's noise from naming anyone; a named rank is reported once per generation.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable

from unicron.services.detector.settings import DetectorSettings
from unicron.services.detector.signals import Candidate
from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.reports import StepCompleted
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind

_Key = tuple[str, int]


class _JobWindow:
    def __init__(self, window: int) -> None:
        self.compute: dict[int, deque[float]] = defaultdict(lambda: deque(maxlen=window))
        self.reports_per_step: dict[int, int] = defaultdict(int)
        self.streak: dict[int, int] = defaultdict(int)
        self.named: set[int] = set()
        self.node_of: dict[int, str] = {}


class StragglerWatch:
    def __init__(self, settings: DetectorSettings, emit: Callable[[Candidate], Awaitable[object]]):
        self.settings = settings
        self._emit = emit
        self._jobs: dict[_Key, _JobWindow] = {}

    def _window(self, report: StepCompleted) -> _JobWindow:
        key = (report.job_id, report.generation)
        if key not in self._jobs:
            for old in [k for k in self._jobs if k[0] == report.job_id]:
                del self._jobs[old]  # an older generation of this job is over
            self._jobs[key] = _JobWindow(self.settings.straggler_window)
        return self._jobs[key]

    async def on_step(self, report: StepCompleted) -> None:
        if report.compute_s is None:
            return
        window = self._window(report)
        window.compute[report.rank].append(report.compute_s)
        window.node_of[report.rank] = report.node_id
        window.reports_per_step[report.step] += 1
        if window.reports_per_step[report.step] < len(window.compute):
            return  # wait until every rank has reported this step
        del window.reports_per_step[report.step]
        for rank in self._verdicts(window):
            await self._emit(self._candidate(report, window, rank))

    def _verdicts(self, window: _JobWindow) -> list[int]:
        full = {r: q for r, q in window.compute.items() if len(q) == q.maxlen}
        if len(full) < 2:
            return []
        medians = {rank: statistics.median(q) for rank, q in full.items()}
        named = []
        for rank, median in medians.items():
            peers = statistics.median(m for r, m in medians.items() if r != rank)
            slow = (
                median >= self.settings.straggler_ratio * peers
                and median - peers >= self.settings.straggler_min_excess_s
            )
            window.streak[rank] = window.streak[rank] + 1 if slow else 0
            if window.streak[rank] >= self.settings.straggler_patience and rank not in window.named:
                window.named.add(rank)
                named.append(rank)
        return named

    @staticmethod
    def _candidate(report: StepCompleted, window: _JobWindow, rank: int) -> Candidate:
        medians = {str(r): round(statistics.median(q), 4) for r, q in window.compute.items()}
        return Candidate.of(
            window.node_of[rank],
            WorkerKey(report.job_id, report.generation, rank),
            FailureKind.STRAGGLER,
            FailureCategory.STRAGGLER,
            report.at,
            {"step": report.step, "median_compute_s": medians},
        )
