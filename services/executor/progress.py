"""Job progress from worker reports: started workers, steps, the end of a transition, success.

Only reports of a job's current generation count; a report from an older generation is what a
replaced worker said on its way out — except the exit of a survivor that was to re-form into
the current generation, which fails the in-place transition. A worker of an in-place generation
that exits before the generation's first step fails the transition too: ``on_failed`` falls
back to a restart from the checkpoint. The first step of a generation ends its transition:
``transition.completed`` (:mod:`unicron.services.executor.completion`) says where the state
came from and how long each phase took. A job
with its own entrypoint may never report a step: it is RUNNING once all its workers started.

Reports come in batches (``Bus.consume(batch=…)``): each job's are applied in one write of its
record, cut after a report that moves the job's state so that each move is announced. A step of
any rank but 0 in a generation already stepping changes nothing and is not even read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator

from unicron.services.executor.completion import complete_transition
from unicron.services.executor.metrics import ExecutorMetrics
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import JobStateChanged
from unicron.shared.contracts.models import Job, JobState, WorkerState
from unicron.shared.contracts.reports import (
    AnyReport,
    AnyWorkerReport,
    StepCompleted,
    StepsCompleted,
    WorkerExited,
    WorkerRegrouped,
    WorkerStarted,
)
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.contracts.transitions import TransitionMode
from unicron.shared.store.state import StateStore

Report = AnyWorkerReport
_TRACKED = (WorkerStarted, StepCompleted, WorkerRegrouped, WorkerExited)
REMEMBERED_GENERATIONS = 4096
_TRANSITIONING = (JobState.STARTING, JobState.RECOVERING)
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


def _record_step(job: Job, report: StepCompleted) -> bool:
    """Rank 0's step becomes the job's step and loss; False when it changes nothing. A new
    generation may resume below the job's step (a rollback). Within one generation, or once the
    job ended, a lower step is a late copy of an earlier report (its fast copy lost, its stream
    copy overtaken), and a higher one still counts after the exits that ended the job."""
    late = report.step < job.step and (
        report.generation == job.step_generation or job.state.terminal
    )
    if report.rank != 0 or report.step == job.step or late:
        return False
    job.step, job.loss, job.step_generation = report.step, report.loss, report.generation
    return True


def _each_rank(reports: list[AnyReport]) -> Iterator[AnyReport]:
    """The reports, a node's batch of steps (``StepsCompleted``) as its ranks' steps."""
    for report in reports:
        yield from report.steps if isinstance(report, StepsCompleted) else [report]


class ProgressTracker:
    def __init__(
        self, bus: Bus, state: StateStore, on_failed: TransitionFailed = _no_fallback
    ) -> None:
        self.bus = bus
        self.state = state
        self.on_failed = on_failed
        self.metrics = bus.metrics.part(ExecutorMetrics)
        # generations seen stepping: another rank's step there changes nothing in the record
        self._stepping: OrderedDict[tuple[str, int], None] = OrderedDict()

    async def on_report(self, report: AnyReport) -> None:
        await self.on_reports([report])

    async def on_reports(self, reports: list[AnyReport]) -> None:
        """Reports in the order they came; each job's are applied together, in a few writes of
        its record however many ranks reported (``Bus.consume(batch=…)``)."""
        by_job: dict[str, list[Report]] = {}
        for report in _each_rank(reports):
            self.metrics.report(report)
            if isinstance(report, _TRACKED) and not self._settled(report):
                by_job.setdefault(report.job_id, []).append(report)
        for job_id, pending in by_job.items():
            while pending:
                pending = await self._apply(job_id, pending)

    def _settled(self, report: Report) -> bool:
        """A step of a rank other than 0 in a generation already stepping: nothing to write."""
        key = (report.job_id, report.generation)
        return isinstance(report, StepCompleted) and report.rank != 0 and key in self._stepping

    async def _apply(self, job_id: str, reports: list[Report]) -> list[Report]:
        """Apply ``reports`` in one write, up to the first that moves the job's state or ends
        its transition (each is announced on its own); returns the rest."""
        applied, began, before = 0, None, None

        def mutate(job: Job) -> bool:
            nonlocal applied, began, before
            applied, began, before, changed = 0, None, None, False
            # Only the state is announced: a deep copy of a record of thousands of workers per
            # batch of reports was a third of the executor's CPU at 512 nodes (bench/scale.py).
            was = job.state
            for report in reports:
                applied += 1
                state = job.state
                if job.generation == report.generation and report.rank < len(job.workers):
                    moved, began = self._change(job, report)
                    changed = moved or changed
                if job.state != state or began is not None:
                    break
            before = was if changed else None
            return changed

        after = await self.state.update_job(job_id, mutate)
        if after is None:
            return []  # no such job (any more): nothing to track
        if after.stepping:
            self._stepping[(after.id, after.generation)] = None
            while len(self._stepping) > REMEMBERED_GENERATIONS:
                self._stepping.popitem(last=False)
        if before is not None:
            await self._announce(before, after)
            if began is not None:
                event = await complete_transition(self.bus, self.state, after, began)
                self.metrics.transition_completed(after, event)
        exits = [r for r in reports[:applied] if isinstance(r, WorkerExited)]
        if exits:
            await self._after_exits(after, exits)
        return reports[applied:]

    def _change(self, job: Job, report: Report) -> tuple[bool, StepCompleted | None]:
        """Whether ``report`` changed ``job``, and the step that ended its transition."""
        if isinstance(report, WorkerStarted):
            return self._started(job, report), None
        if isinstance(report, WorkerRegrouped):
            return self._regrouped(job, report), None
        if isinstance(report, WorkerExited):
            return self._exited(job, report), None
        if isinstance(report, StepCompleted):
            return self._advance(job, report)
        return False, None

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

    @staticmethod
    def _advance(job: Job, report: StepCompleted) -> tuple[bool, StepCompleted | None]:
        if job.state.terminal:  # a late step of a cancelled job never revives it
            return _record_step(job, report), None
        # a late step of a generation already recorded as failed starts nothing
        fresh = not job.needs_recovery()
        first_step = fresh and (job.state in _TRANSITIONING or not job.stepping)
        # this report is the generation's first step: its transition is done
        began = report if first_step and job.state in _TRANSITIONING else None
        if first_step:
            job.stepping = True
            if job.state != JobState.RUNNING:  # RUNNING already once its workers started
                reason = f"generation {job.generation} stepping"
                job.set_state(JobState.RUNNING, reason, by=ServiceRole.EXECUTOR)
        if _record_step(job, report):
            return True, began
        return first_step, began

    async def _after_exits(self, job: Job, exits: list[WorkerExited]) -> None:
        """Any exit before the in-place generation's first step fails it, a clean one too (a
        survivor that finished the job's last step cannot re-form any more)."""
        for report in exits:
            if job.transition_kind != TransitionMode.IN_PLACE or job.stepping:
                return
            current = job.generation == report.generation
            # a survivor that died before (or without) taking the regroup speaks for its old rank
            survivor = any(
                w.from_generation == report.generation and w.from_rank == report.rank
                for w in job.workers
            )
            if current or survivor:
                await self.on_failed(job.id, job.generation, _exit_text(report))
                fresh = await self.state.get_job(job.id)  # the fallback may have moved it on
                if fresh is None:
                    return
                job = fresh

    async def on_failure_detected(self, failure_id: str, job_id: str, detected_at: float) -> None:
        """Note when a job's last failure was detected, for the detect and plan phases."""

        def note(job: Job) -> bool:
            last = job.last_failure
            if last is None or last.failure_id != failure_id or last.detected_at is not None:
                return False
            last.detected_at = detected_at
            return True

        await self.state.update_job(job_id, note)

    async def _announce(self, old: JobState, new: Job) -> None:
        event = JobStateChanged.between(old, new)
        if event is not None:
            await self.bus.publish_event(event)
