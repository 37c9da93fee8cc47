"""Detector service wiring: worker reports, agents' GPU health reports and heartbeats in, one
``failure.detected`` per fault.

Level-triggered: a failed worker that the event path missed (say the detector was down) is still
found by the periodic reconcile from the job records in Redis.
"""

from __future__ import annotations

import asyncio
import contextlib

from unicron.services.detector.correlate import Correlator
from unicron.services.detector.gpufaults import GpuFaults
from unicron.services.detector.liveness import Liveness
from unicron.services.detector.metrics import DetectorMetrics
from unicron.services.detector.nodes import NodeMonitor
from unicron.services.detector.quarantine import NodeHealth
from unicron.services.detector.record import FailureRecorder
from unicron.services.detector.settings import DetectorSettings
from unicron.services.detector.signals import Candidate, from_exception, from_exit, from_hang
from unicron.services.detector.stragglers import StragglerWatch
from unicron.services.detector.suspicion import Suspicion
from unicron.shared.bus.api import EventBus
from unicron.shared.bus.streams import reports_of_kind
from unicron.shared.claims import ReportClaims
from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.models import JobState, WorkerState, now
from unicron.shared.contracts.reports import (
    WORKER_REPORT,
    AnyWorkerReport,
    GpuHealthReport,
    StepCompleted,
    StepsCompleted,
    WorkerException,
    WorkerExited,
    WorkerHung,
)
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind
from unicron.shared.logging import get_logger
from unicron.shared.outage import Outage
from unicron.shared.store.api import JobStore
from unicron.shared.store.hearing import Hearing
from unicron.shared.store.summaries import job_summaries

log = get_logger()
CONSUMED_REPORTS = ("worker_exited", "worker_exception", "worker_hung", "step_completed")


class Detector:
    def __init__(self, bus: EventBus, state: JobStore, settings: DetectorSettings) -> None:
        self.state = state
        self.settings = settings
        bus.metrics.part(DetectorMetrics)  # counts the failures as they are published
        self.health = NodeHealth(bus, state, settings)
        self.recorder = FailureRecorder(bus, state, settings, self.health)
        hearing = Hearing(settings.node_timeout_s)
        self.suspicion = Suspicion(bus, settings)
        self.liveness = Liveness(bus, state, settings, hearing)
        self.correlator = Correlator(settings.correlation_window_s, self._emit, self.liveness.hold)
        self.nodes = NodeMonitor(bus, state, self.correlator, hearing, self.suspicion)
        # Stragglers are advisory: they bypass correlation so a later fault is still reported.
        self.stragglers = StragglerWatch(settings, self._emit)
        self.gpus = GpuFaults(state, self.correlator, self._emit, self.health)
        self._failed_seen: set[WorkerKey] = set()  # failed workers the last reconcile found

    async def _emit(self, cause: Candidate) -> bool:
        if await self.liveness.stepped_on(cause):
            return False
        return await self.recorder.record(cause)

    async def on_steps(self, batch: StepsCompleted) -> None:
        self.suspicion.heard(batch.node_id, max(step.at for step in batch.steps))
        for step in batch.steps:
            await self.stragglers.on_step(step)

    async def on_report(self, report: AnyWorkerReport) -> None:
        if isinstance(report, WorkerException):
            self.suspicion.heard_exception(report)
        else:
            self.suspicion.heard(report.node_id, report.at)
        if isinstance(report, StepCompleted):
            await self.stragglers.on_step(report)
            return
        candidate: Candidate | None = None
        if isinstance(report, WorkerExited):
            candidate = from_exit(report)
        elif isinstance(report, WorkerException):
            candidate = from_exception(report)
        elif isinstance(report, WorkerHung):
            candidate = from_hang(report)
        if candidate is not None:
            await self.correlator.add(candidate)

    async def reconcile(self) -> None:
        """Find failed workers of running generations that have no failure recorded.

        A worker is taken up only on the second look in a row: the executor marks it failed
        from the same exit report that is on its way here, and a candidate made from the record
        alone (no signal, no exception) must not beat the report that names the cause."""
        seen, self._failed_seen = self._failed_seen, set()
        for summary in await job_summaries(self.state):
            running = summary.state in (JobState.RUNNING, JobState.STARTING)
            if not running or not summary.failed_ranks or summary.needs_recovery():
                continue
            job = await self.state.get_job(summary.id)
            if job is None or job.needs_recovery():
                continue
            failed = next((w for w in job.workers if w.state == WorkerState.FAILED), None)
            if failed is None:
                continue
            key = WorkerKey(job.id, job.generation, failed.rank)
            self._failed_seen.add(key)
            if key not in seen:
                continue
            await self.correlator.add(
                Candidate.of(
                    failed.node_id,
                    key,
                    FailureKind.EXIT,
                    FailureCategory.EXITED_ABNORMALLY,
                    observed_at=job.history[-1].at if job.history else job.submitted_at,
                    evidence={"exit_code": failed.exit_code, "found_by": "reconcile"},
                )
            )

    async def watch(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_reconcile = 0.0
        outage = Outage("detector check", component="detector")
        while not stop.is_set():
            try:
                await self.nodes.check()
                if loop.time() >= next_reconcile:
                    await self.health.review()
                    await self.reconcile()
                    next_reconcile = loop.time() + self.settings.reconcile_interval_s
                outage.ok()
            except Exception as exc:
                # Without a pause a failing check spins: the next node is already overdue.
                outage.failed(exc)
                await outage.pause(stop)
                continue
            # A hair past the next node's deadline (its silence must exceed the timeout), but
            # never longer than the polling interval: a new node may have registered meanwhile.
            due_in = self.nodes.next_due - now() + 0.002
            wait = min(self.settings.node_check_interval_s, max(due_in, 0.0))
            planned = loop.time() + wait
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
            # A loop that wakes late was starved: what it asked may have timed out on its side.
            self.suspicion.woke(loop.time() - planned)


async def run(
    bus: EventBus, state: JobStore, stop: asyncio.Event, settings: DetectorSettings
) -> None:
    detector = Detector(bus, state, settings)
    claims = ReportClaims(state)
    # Side by side: a restarted detector hears the reports it missed a few round trips sooner.
    await asyncio.gather(
        *(
            bus.consume(
                reports_of_kind(kind),
                durable=f"detector-{kind}",
                parse=WORKER_REPORT.validate_json,
                handler=detector.on_report,
                deliver_new=kind == "step_completed",  # telemetry is only useful live
                claim=claims.check,
            )
            for kind in CONSUMED_REPORTS
        ),
        bus.consume(
            reports_of_kind("steps_completed"),
            durable="detector-steps_completed",
            parse=StepsCompleted.model_validate_json,
            handler=detector.on_steps,
            deliver_new=True,
            claim=claims.check,
        ),
        bus.consume(
            reports_of_kind("gpu_health"),
            durable="detector-gpu_health",
            parse=GpuHealthReport.model_validate_json,
            handler=detector.gpus.on_report,
            claim=claims.check,
        ),
    )
    try:
        await detector.watch(stop)
    finally:
        await detector.suspicion.close()
        await detector.correlator.close()
