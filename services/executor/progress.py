"""Job progress from worker reports: started workers, steps, the end of a transition, success.

Only reports of a job's current generation count; a report from an older generation is what a
replaced worker said on its way out — except the exit of a survivor that was to re-form into
the current generation, which fails the in-place transition. A worker of an in-place generation
that exits before the generation's first step fails the transition too: ``on_failed`` falls
back to a restart from the checkpoint. The first step of a generation ends its transition:
``transition.completed`` says where the state came from and how long each phase took. A job
with its own entrypoint may never report a step: it is RUNNING once all its workers started.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import JobStateChanged, TransitionCompleted
from unicron.shared.contracts.models import FailureRecord, Job, JobState, PlanAction, WorkerState
from unicron.shared.contracts.reports import (
    AnyReport,
    AnyWorkerReport,
    StepCompleted,
    WorkerExited,
    WorkerRegrouped,
    WorkerStarted,
)
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.contracts.transitions import StateSource, TransitionMode
from unicron.shared.logging import get_logger
from unicron.shared.store.state import StateStore

Report = AnyWorkerReport
_TRANSITIONING = (JobState.STARTING, JobState.RECOVERING)
_Change = Callable[[Job], bool]
_EXECUTOR = ServiceRole.EXECUTOR
TransitionFailed = Callable[[str, int, str], Awaitable[object]]


async def _no_fallback(_job_id: str, _generation: int, _why: str) -> None:
    return None


def _worker_exit_state(report: WorkerExited) -> WorkerState:
    if report.stopped_by_agent:
        return WorkerState.STOPPED
    return WorkerState.SUCCEEDED if report.exit_code == 0 else WorkerState.FAILED


def _exit_text(report: WorkerExited) -> str:
    how = f"signal {report.signal}" if report.signal is not None else f"code {report.exit_code}"
    by = ", stopped by its agent" if report.stopped_by_agent else ""
    return f"g{report.generation} r{report.rank} on {report.node_id} exited ({how}{by})"


class ProgressTracker:
    def __init__(
        self, bus: Bus, state: StateStore, on_failed: TransitionFailed = _no_fallback
    ) -> None:
        self.bus = bus
        self.state = state
        self.on_failed = on_failed

    async def on_report(self, report: AnyReport) -> None:
        if isinstance(report, WorkerStarted):
            await self._update(report, lambda job: self._started(job, report))
        elif isinstance(report, StepCompleted):
            await self._on_step(report)
        elif isinstance(report, WorkerRegrouped):
            await self._update(report, lambda job: self._regrouped(job, report))
        elif isinstance(report, WorkerExited):
            await self._on_exit(report)

    async def _update(self, report: Report, change: _Change) -> tuple[Job, Job] | None:
        before: Job | None = None

        def mutate(job: Job) -> bool:
            nonlocal before
            before = None
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
        worker.set_state(WorkerState.RUNNING, "its process started", by=_EXECUTOR, job_id=job.id)
        everyone = all(w.state == WorkerState.RUNNING for w in job.workers)
        # A job that reported a step speaks the training API: its first step ends the
        # transition (and says how long it took); only one that never did is RUNNING on start.
        plain = job.spec.entrypoint is not None and not job.needs_recovery() and job.step == 0
        if plain and everyone and job.state in _TRANSITIONING:
            reason = f"generation {job.generation}: all {len(job.workers)} workers started"
            job.set_state(JobState.RUNNING, reason, by=ServiceRole.EXECUTOR)
        return True

    @staticmethod
    def _regrouped(job: Job, report: WorkerRegrouped) -> bool:
        worker = job.workers[report.rank]
        if worker.regrouped_at is not None:
            return False
        worker.regrouped_at = report.at
        worker.state_source = report.state_source
        worker.state_transfer_s = report.state_transfer_s
        worker.resumed_step = report.resumed_step
        worker.pid = report.pid
        if worker.state == WorkerState.LAUNCHING:
            worker.set_state(
                WorkerState.RUNNING, "it re-formed in place", by=_EXECUTOR, job_id=job.id
            )
        return True

    @staticmethod
    def _exited(job: Job, report: WorkerExited) -> bool:
        worker = job.workers[report.rank]
        worker.pid = report.pid
        worker.exit_code = report.exit_code if report.signal is None else -report.signal
        exit_state = _worker_exit_state(report)
        worker.set_state(exit_state, _exit_text(report), by=_EXECUTOR, job_id=job.id)
        done = all(w.state == WorkerState.SUCCEEDED for w in job.workers)
        if done and not job.state.terminal:
            reason = f"all {len(job.workers)} workers finished"
            job.set_state(JobState.SUCCEEDED, reason, by=ServiceRole.EXECUTOR)
        return True

    async def _on_exit(self, report: WorkerExited) -> None:
        await self._update(report, lambda job: self._exited(job, report))
        # Any exit before the in-place generation's first step fails it, a clean one too (a
        # survivor that finished the job's last step cannot re-form any more).
        job = await self.state.get_job(report.job_id)
        if job is None or job.transition_kind != TransitionMode.IN_PLACE or job.stepping:
            return
        current = job.generation == report.generation
        # a survivor that died before (or without) taking the regroup speaks for its old rank
        survivor = any(
            w.from_generation == report.generation and w.from_rank == report.rank
            for w in job.workers
        )
        if current or survivor:
            await self.on_failed(job.id, job.generation, _exit_text(report))

    async def _on_step(self, report: StepCompleted) -> None:
        began = False  # this report is the generation's first step: its transition is done

        def advance(job: Job) -> bool:
            nonlocal began
            if job.state.terminal:  # a late step of a cancelled job never revives it
                return False
            # a late step of a generation already recorded as failed starts nothing
            fresh = not job.needs_recovery()
            first_step = fresh and (job.state in _TRANSITIONING or not job.stepping)
            began = first_step and job.state in _TRANSITIONING
            if first_step:
                job.stepping = True
                if job.state != JobState.RUNNING:  # RUNNING already once its workers started
                    reason = f"generation {job.generation} stepping"
                    job.set_state(JobState.RUNNING, reason, by=ServiceRole.EXECUTOR)
            if report.rank == 0 and report.step != job.step:
                job.step = report.step
                job.loss = report.loss
                return True
            return first_step

        changed = await self._update(report, advance)
        if changed is not None and began:
            await self._complete_transition(changed[0], changed[1], report)

    async def _complete_transition(self, before: Job, job: Job, report: StepCompleted) -> None:
        failure = job.last_failure
        lag = 2 if job.transition_fallback else 1
        answered = failure is not None and failure.generation == job.generation - lag
        downtime = report.at - failure.observed_at if answered and failure else None
        started = job.transition_started_at or report.at
        action = job.transition or PlanAction.START
        source, resumed = self._state_source(job, report)
        phases = await self._phases(job, report, failure if answered else None, started)
        await self.bus.publish_event(
            TransitionCompleted(
                job_id=job.id,
                action=action,
                generation=job.generation,
                world_size=job.world_size,
                resumed_step=resumed,
                downtime_s=downtime,
                duration_s=max(0.0, report.at - started),
                kind=job.transition_kind,
                state_source=source,
                phases=phases,
                fallback=job.transition_fallback,
            )
        )
        get_logger(job_id=job.id).info(
            "transition completed",
            generation=job.generation,
            kind=job.transition_kind,
            state_source=source,
            downtime_s=downtime,
            phases=phases,
        )

    @staticmethod
    def _state_source(job: Job, report: StepCompleted) -> tuple[StateSource, int]:
        """Where the new generation's state came from, and the step it resumed from."""
        regrouped = [w for w in job.workers if w.regrouped_at is not None]
        in_place = job.transition_kind == TransitionMode.IN_PLACE
        if report.resumed_from is not None:
            resumed = report.resumed_from
        elif any(w.resumed_step is not None for w in regrouped):
            resumed = min(w.resumed_step or 0 for w in regrouped) - 1
        elif in_place:
            resumed = max(0, report.step - 1)
        else:
            resumed = 0
        sources = [w.state_source for w in regrouped if w.state_source is not None]
        if in_place and any(not w.survivor for w in job.workers):
            # a joiner takes a live rank's state (its report may arrive after the first step)
            sources.append(StateSource.PEER)
        source = StateSource.farthest(sources)
        if source is None:
            fresh = StateSource.DISK if resumed > 0 else StateSource.NONE
            source = StateSource.MEMORY if in_place else fresh
        return source, max(0, resumed)

    async def _phases(
        self, job: Job, report: StepCompleted, failure: FailureRecord | None, started: float
    ) -> dict[str, float]:
        phases: dict[str, float] = {}
        detected = None
        if failure is not None and failure.detected_at is not None:
            detected = failure.detected_at
            phases["detect"] = max(0.0, detected - failure.observed_at)
        plan = await self.state.get_plan(job.plan_id) if job.plan_id else None
        if failure is not None and plan is not None:
            phases["plan"] = max(0.0, plan.created_at - (detected or failure.observed_at))
        regrouped = [w.regrouped_at for w in job.workers if w.regrouped_at is not None]
        ready = started
        if regrouped:
            ready = max(regrouped)
            phases["regroup"] = max(0.0, ready - started)
        transfers = [w.state_transfer_s for w in job.workers if w.state_transfer_s is not None]
        if transfers:
            phases["state_transfer"] = max(transfers)
        phases["first_step"] = max(0.0, report.at - ready)
        return {name: round(value, 4) for name, value in phases.items()}

    async def on_failure_detected(self, failure_id: str, job_id: str, detected_at: float) -> None:
        """Note when a job's last failure was detected, for the detect and plan phases."""

        def note(job: Job) -> bool:
            last = job.last_failure
            if last is None or last.failure_id != failure_id or last.detected_at is not None:
                return False
            last.detected_at = detected_at
            return True

        await self.state.update_job(job_id, note)

    async def _announce(self, old: Job, new: Job) -> None:
        event = JobStateChanged.between(old, new)
        if event is not None:
            await self.bus.publish_event(event)
