"""Record a failure once: the ``failure.detected`` event and the job's ``last_failure``.

Safe to repeat: the event id is derived from (job, generation) so NATS drops a re-published
copy, and the job record is only changed while no failure is recorded for that generation.
A failure of the generation that was started to recover from the previous one (the next, or the
one after it where the in-place answer fell back to a checkpoint restart), within the escalation
window and before that generation trained ``escalation_steps`` steps, escalates:
reattempt → restart → reconfigure (docs/design.md §3). An exit before an in-place generation
stepped is the executor's to answer (it restarts every rank), not recorded here. Advisory
failures (a straggler) are published but leave the job running. A failure of a generation an
admin's drill targeted carries the drill's fault id in ``evidence["drill"]``.
A failure of the job's own code (``software_other``) fails the job once it happened more than
``max_restarts`` times, and never escalates: the same code fails the same way on any node, so
moving the job (and counting it against a node) would not help. A worker that could not be
started at all fails it at once.
"""

from __future__ import annotations

from unicron.services.detector.quarantine import NodeHealth
from unicron.services.detector.settings import DetectorSettings
from unicron.services.detector.signals import Candidate
from unicron.shared.bus.api import EventBus
from unicron.shared.contracts.events import FailureDetected, JobStateChanged
from unicron.shared.contracts.models import Job, JobState
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.contracts.taxonomy import (
    FailureKind,
    RecoveryAction,
    Severity,
    escalate,
    severity_of,
    users_code,
)
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


def _gives_up(job: Job, failure: FailureDetected, launch_failed: bool) -> str | None:
    """Why the job must fail rather than recover, or None; counts failures of its own code."""
    where = f"rank {failure.rank} on {failure.node_id}"
    if launch_failed:
        return f"{where} cannot start: {failure.message}"
    if not users_code(failure.category):
        return None
    job.code_failures += 1
    if job.code_failures <= job.spec.max_restarts:
        return None
    restarts = job.spec.max_restarts
    return f"{_what(failure)} ({where}); failed after {restarts} restart(s) (max_restarts)"


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

    def _grade(self, job: Job, cause: Candidate) -> tuple[Severity, RecoveryAction, dict[str, str]]:
        severity, action = severity_of(cause.category)
        if action == RecoveryAction.REATTEMPT and not cause.lives_on:
            # The rank's process is gone or on its way out: there is no one to reattempt.
            action = RecoveryAction.RESTART
        last = job.answered_failure()  # record() took only a cause of the current generation
        # A recovery that trained on for ``escalation_steps`` worked: what fails later is a
        # new fault, not the same one coming back.
        proven = (
            last is not None
            and last.step is not None
            and job.step - last.step >= self.settings.escalation_steps
        )
        repeated = (
            action != RecoveryAction.REPORT
            and not users_code(cause.category)
            and last is not None
            and not proven
            and cause.observed_at - last.observed_at <= self.settings.escalation_window_s
        )
        if not repeated or last is None:
            return severity, action, {}
        escalated = escalate(last.action, action)
        return *escalated, {"escalated_from": action.value, "previous_failure": last.failure_id}

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
        severity, action, escalation = self._grade(job, cause)
        drill = await self.state.drill_of(cause.job_id, cause.generation)
        if drill is not None:
            escalation["drill"] = drill
        advisory = action == RecoveryAction.REPORT
        if not advisory and _already_recorded(job, cause.generation):
            return True
        failure = FailureDetected.of(
            cause.category,
            graded=(severity, action),
            failure_id=_failure_id(cause, advisory),
            job_id=cause.job_id,
            node_id=cause.node_id,
            rank=cause.rank,
            generation=cause.generation,
            kind=cause.kind,
            observed_at=cause.observed_at,
            evidence={**cause.evidence, **escalation},
            exc_type=cause.evidence.get("exc_type"),
            message=cause.evidence.get("message"),
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
            severity=severity.value,
            action=action.value,
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
            j.last_failure = failure.record(j.step)
            fatal = _gives_up(j, failure, launch_failed)
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
