"""Record a failure once: the ``failure.detected`` event and the job's ``last_failure``.

Safe to repeat: the event id is derived from (job, generation) so NATS drops a re-published
copy, and the job record is only changed while no failure is recorded for that generation.
A failure of the generation that was started to recover from the previous one (the next, or the
one after it where the in-place answer fell back to a checkpoint restart), within the escalation
window and before that generation trained ``escalation_steps`` steps, escalates:
reattempt → restart → reconfigure (docs/design.md §3), unless it follows the job to other
nodes (:mod:`unicron.services.detector.grading`). An exit before an in-place generation
stepped is the executor's to answer (it restarts every rank), not recorded here. Advisory
failures (a straggler) are published but leave the job running. A failure of a generation an
admin's drill targeted carries the drill's fault id in ``evidence["drill"]``.
A failure of the job's own (its code's, as ``software_other`` or ``collective_mismatch``, or
one that followed it to other nodes) fails the job once it happened more than ``max_restarts``
times, and never escalates: it fails the same way on any node, so moving the job (and counting
it against a node) would not help. A worker that could not be started at all fails it at once.
"""

from __future__ import annotations

from unicron.services.detector.grading import Grade, grade
from unicron.services.detector.quarantine import NodeHealth
from unicron.services.detector.settings import DetectorSettings
from unicron.services.detector.signals import Candidate
from unicron.shared.bus.api import EventBus
from unicron.shared.contracts.blame import job_failures
from unicron.shared.contracts.events import FailureDetected, JobStateChanged
from unicron.shared.contracts.models import FailureRecord, Job, JobState
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.contracts.taxonomy import FailureKind, RecoveryAction, severity_of, users_code
from unicron.shared.contracts.transitions import TransitionMode
from unicron.shared.logging import get_logger
from unicron.shared.store.api import JobStore


def _already_recorded(job: Job, generation: int) -> bool:
    return job.last_failure is not None and job.last_failure.generation == generation


def _what(failure: FailureDetected) -> str:
    """The failure in a few words: its exception's first line, or its kind and category."""
    if failure.exc_type is None:
        return f"{failure.kind.value}: {failure.category.value}"
    first = (failure.message or "").strip().splitlines()[:1]
    return f"{failure.exc_type}: {first[0][:300]}" if first else failure.exc_type


def _gives_up(
    job: Job, failure: FailureDetected, launch_failed: bool, previous: FailureRecord | None
) -> str | None:
    """Why the job must fail rather than recover, or None; counts the job's own failures
    (``previous``: its last failure before this one)."""
    where = f"rank {failure.rank} on {failure.node_id}"
    if launch_failed:
        return f"{where} cannot start: {failure.message}"
    counted = job_failures(failure, previous)
    if not counted:
        return None
    job.code_failures += counted
    if job.code_failures <= job.spec.max_restarts:
        return None
    whose = "it followed the job to other nodes" if failure.follows_job else "the job's own code"
    restarts = job.spec.max_restarts
    return (
        f"{_what(failure)} ({where}); {failure.category.value}, {whose}: "
        f"failed after {restarts} restart(s) (max_restarts)"
    )


def _left_to_fallback(job: Job, cause: Candidate) -> bool:
    """An exit of an in-place generation before its first step: the executor answers it by
    restarting every rank from the checkpoint (:mod:`unicron.services.executor.progress`).
    Recording it too would answer one fault twice, and a survivor killed with its peer (whose
    exit the regroup sent to it made the new generation's) would grade that restart as a failed
    recovery. A fault that moves the job off its node, or one of the job's own code (counted
    toward its ``max_restarts``), is still recorded: the fallback then leaves it to the plan."""
    if cause.kind not in (FailureKind.CRASH, FailureKind.EXIT):
        return False
    if job.transition_kind != TransitionMode.IN_PLACE or job.stepping:
        return False
    _, action = severity_of(cause.category)
    return action != RecoveryAction.RECONFIGURE and not users_code(cause.category)


def _failure_id(cause: Candidate, advisory: bool) -> str:
    base = f"{cause.job_id}:{cause.generation}"
    return f"{base}:{cause.kind.value}:{cause.rank}" if advisory else base


class FailureRecorder:
    def __init__(
        self, bus: EventBus, state: JobStore, settings: DetectorSettings, health: NodeHealth
    ) -> None:
        self.bus = bus
        self.state = state
        self.settings = settings
        self.health = health

    async def _grade(self, job: Job, cause: Candidate, drill: str | None) -> Grade:
        """``cause`` graded, knowing whether a drill injected it or the failure it repeats."""
        last = job.answered_failure()
        drilled = drill is not None or (
            last is not None and await self.state.drill_of(job.id, last.generation) is not None
        )
        return grade(job, cause, self.settings, drilled)

    async def record(self, cause: Candidate) -> bool:
        """Record ``cause`` unless its generation is gone or has its failure already. False
        only when it is left to the executor's fallback: should the generation step on before
        that acts, a later report of the same fault must still be heard."""
        log = get_logger(job_id=cause.job_id, node_id=cause.node_id)
        job = await self.state.get_job(cause.job_id)
        if job is None or job.state.terminal or cause.generation != job.generation:
            log.info("stale failure report ignored", generation=cause.generation)
            return True
        if _left_to_fallback(job, cause):
            log.info("exit before the in-place generation stepped: the executor restarts it",
                     generation=cause.generation, rank=cause.rank)  # fmt: skip
            return False
        drill = await self.state.drill_of(cause.job_id, cause.generation)
        graded = await self._grade(job, cause, drill)
        advisory = graded.action == RecoveryAction.REPORT
        if not advisory and _already_recorded(job, cause.generation):
            return True
        failure = FailureDetected.of(
            cause.category,
            graded=(graded.severity, graded.action),
            failure_id=_failure_id(cause, advisory),
            job_id=cause.job_id,
            node_id=cause.node_id,
            rank=cause.rank,
            generation=cause.generation,
            kind=cause.kind,
            observed_at=cause.observed_at,
            evidence={**cause.evidence, **graded.evidence, **({"drill": drill} if drill else {})},
            exc_type=cause.evidence.get("exc_type"),
            message=cause.evidence.get("message"),
            follows_job=graded.follows_job,
        )
        # The job record first: whoever sees the event finds the failure recorded.
        launch_failed = bool(cause.evidence.get("launch_failed"))
        marked, state_change = (
            (True, None) if advisory else await self._mark_job(job, failure, launch_failed)
        )
        if not marked:  # the job moved on (a fallback, a cancel) since it was read
            log.info("failure of a generation no longer running", generation=cause.generation)
            return True
        await self.bus.publish_event(failure)
        if state_change is not None:
            await self.bus.publish_event(state_change)
        log.warning(
            "failure detected",
            kind=cause.kind.value,
            category=cause.category.value,
            severity=failure.severity.value,
            action=failure.action.value,
            follows_job=failure.follows_job,
            rank=cause.rank,
            latency_s=round(failure.detected_at - cause.observed_at, 4),
        )
        await self.health.blame(failure)
        return True

    async def _mark_job(
        self, job: Job, failure: FailureDetected, launch_failed: bool
    ) -> tuple[bool, JobStateChanged | None]:
        """Whether the job now records ``failure``, and the move of its state that announces."""
        marked = False

        def mark(j: Job) -> bool:
            nonlocal marked
            marked = False
            if j.generation != failure.generation or _already_recorded(j, failure.generation):
                return False
            if j.state.terminal:  # cancelled since it was read: nothing left to recover
                return False
            previous, j.last_failure = j.last_failure, failure.record(j.step)
            fatal = _gives_up(j, failure, launch_failed, previous)
            if fatal is not None:
                j.set_state(JobState.FAILED, fatal, by=ServiceRole.DETECTOR)
            else:
                why = f"{failure.kind.value}: {failure.category.value}"
                j.set_state(JobState.RECOVERING, why, by=ServiceRole.DETECTOR)
            marked = True
            return True

        updated = await self.state.update_job(job.id, mark)
        if updated is None or not marked:
            return False, None
        return True, JobStateChanged.between(job, updated)
