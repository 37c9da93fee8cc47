"""Detector service wiring: consumes worker reports, watches node heartbeats, reconciles.

Level-triggered: a failed worker that the event path missed (say the detector was down) is still
found by the periodic reconcile from the job records in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib

from services.detector.correlate import Correlator
from services.detector.nodes import NodeMonitor
from services.detector.record import FailureRecorder
from services.detector.settings import DetectorSettings
from services.detector.signals import Candidate, from_exception, from_exit
from shared.bus import Bus
from shared.logging import get_logger
from shared.messages import (
    REPORT_SUBJECT_PREFIX,
    WORKER_REPORT,
    StepCompleted,
    WorkerException,
    WorkerExited,
    WorkerStarted,
)
from shared.models import JobState, WorkerState
from shared.state import StateStore
from shared.taxonomy import FailureCategory, FailureKind

Report = WorkerStarted | WorkerExited | StepCompleted | WorkerException
log = get_logger()


class Detector:
    def __init__(self, bus: Bus, state: StateStore, settings: DetectorSettings) -> None:
        self.state = state
        self.settings = settings
        self.recorder = FailureRecorder(bus, state)
        self.correlator = Correlator(settings.correlation_window_s, self._emit)
        self.nodes = NodeMonitor(bus, state, self.correlator, settings.node_timeout_s)

    async def _emit(self, cause: Candidate) -> None:
        await self.recorder.record(cause)

    async def on_report(self, report: Report) -> None:
        candidate: Candidate | None = None
        if isinstance(report, WorkerExited):
            candidate = from_exit(report)
        elif isinstance(report, WorkerException):
            candidate = from_exception(report)
        if candidate is not None:
            await self.correlator.add(candidate)

    async def reconcile(self) -> None:
        """Find failed workers of running generations that have no failure recorded."""
        for job in await self.state.list_jobs():
            if job.state not in (JobState.RUNNING, JobState.STARTING) or job.needs_recovery():
                continue
            for worker in job.workers:
                if worker.state == WorkerState.FAILED:
                    await self.correlator.add(
                        Candidate(
                            job_id=job.id,
                            generation=job.generation,
                            node_id=worker.node_id,
                            rank=worker.rank,
                            kind=FailureKind.EXIT,
                            category=FailureCategory.EXITED_ABNORMALLY,
                            observed_at=job.history[-1].at if job.history else job.submitted_at,
                            evidence={"exit_code": worker.exit_code, "found_by": "reconcile"},
                        )
                    )
                    break

    async def watch(self, stop: asyncio.Event) -> None:
        next_reconcile = 0.0
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            try:
                await self.nodes.check()
                if loop.time() >= next_reconcile:
                    await self.reconcile()
                    next_reconcile = loop.time() + self.settings.reconcile_interval_s
            except Exception:
                log.exception("detector check failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.node_check_interval_s)


async def run(bus: Bus, state: StateStore, stop: asyncio.Event, settings: DetectorSettings) -> None:
    detector = Detector(bus, state, settings)
    for kind in ("worker_exited", "worker_exception"):
        await bus.consume(
            f"{REPORT_SUBJECT_PREFIX}*.{kind}",
            durable=f"detector-{kind}",
            parse=WORKER_REPORT.validate_json,
            handler=detector.on_report,
        )
    try:
        await detector.watch(stop)
    finally:
        await detector.correlator.close()
