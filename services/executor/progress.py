"""Job progress from worker reports: started workers, steps, the end of a transition, success.

Only reports of a job's current generation count; a report from an older generation is what a
replaced worker said on its way out.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.bus import Bus
from shared.events import JobStateChanged, TransitionCompleted
from shared.logging import get_logger
from shared.messages import (
    AnyWorkerReport,
    StepCompleted,
    WorkerExited,
    WorkerStarted,
)
from shared.models import Job, JobState, PlanAction, WorkerState
from shared.state import StateStore

Report = AnyWorkerReport
_TRANSITIONING = (JobState.STARTING, JobState.RECOVERING)
_Change = Callable[[Job], bool]


def _worker_exit_state(report: WorkerExited) -> WorkerState:
    if report.stopped_by_agent:
        return WorkerState.STOPPED
    return WorkerState.SUCCEEDED if report.exit_code == 0 else WorkerState.FAILED


class ProgressTracker:
    def __init__(self, bus: Bus, state: StateStore) -> None:
        self.bus = bus
        self.state = state

    async def on_report(self, report: Report) -> None:
        if isinstance(report, WorkerStarted):
            await self._update(report, lambda job: self._started(job, report))
        elif isinstance(report, StepCompleted):
            await self._on_step(report)
        elif isinstance(report, WorkerExited):
            await self._update(report, lambda job: self._exited(job, report))

    async def _update(self, report: Report, change: _Change) -> tuple[Job, Job] | None:
        before: Job | None = None

        def mutate(job: Job) -> bool:
            nonlocal before
            if job.generation != report.generation or report.rank >= len(job.workers):
                return False
            snapshot = job.model_copy(deep=True)
            if not change(job):
                return False
            before = snapshot
            return True

        after = await self.state.update_job(report.job_id, mutate)
        if after is None or before is None:
            return None
        await self._announce(before, after)
        return before, after

    @staticmethod
    def _started(job: Job, report: WorkerStarted) -> bool:
        worker = job.workers[report.rank]
        if worker.state != WorkerState.LAUNCHING:
            return False
        worker.pid = report.pid
        worker.state = WorkerState.RUNNING
        return True

    @staticmethod
    def _exited(job: Job, report: WorkerExited) -> bool:
        worker = job.workers[report.rank]
        worker.pid = report.pid
        worker.exit_code = report.exit_code if report.signal is None else -report.signal
        worker.state = _worker_exit_state(report)
        done = all(w.state == WorkerState.SUCCEEDED for w in job.workers)
        if done and not job.state.terminal:
            job.set_state(JobState.SUCCEEDED, f"all {len(job.workers)} workers finished")
        return True

    async def _on_step(self, report: StepCompleted) -> None:
        def advance(job: Job) -> bool:
            first_step = job.state in _TRANSITIONING
            if first_step:
                job.set_state(JobState.RUNNING, f"generation {job.generation} stepping")
            if report.rank == 0 and report.step != job.step:
                job.step = report.step
                job.loss = report.loss
                return True
            return first_step

        changed = await self._update(report, advance)
        if changed is not None and changed[0].state in _TRANSITIONING:
            await self._complete_transition(changed[0], changed[1], report)

    async def _complete_transition(self, before: Job, job: Job, report: StepCompleted) -> None:
        failure = job.last_failure
        downtime = None
        if failure is not None and failure.generation == job.generation - 1:
            downtime = report.at - failure.observed_at
        started = job.transition_started_at or report.at
        action = job.transition or PlanAction.START
        await self.bus.publish_event(
            TransitionCompleted(
                job_id=job.id,
                action=action,
                generation=job.generation,
                world_size=job.world_size,
                resumed_step=report.resumed_from or 0,
                downtime_s=downtime,
                duration_s=max(0.0, report.at - started),
            )
        )
        get_logger(job_id=job.id).info(
            "transition completed", generation=job.generation, downtime_s=downtime
        )

    async def _announce(self, old: Job, new: Job) -> None:
        event = JobStateChanged.between(old, new)
        if event is not None:
            await self.bus.publish_event(event)
