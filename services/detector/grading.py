"""How bad a failure is and what answers it: the taxonomy's grade, escalated when the recovery
from the failure before it did not hold, or the job's own when the failure follows the job.

A failure that comes back with the same category after a restart escalates
reattempt → restart → reconfigure while it keeps to one node: that node is the likely cause.
One that comes back on another node follows the job, not a node (ranks that disagree on the
checkpoint step they resumed from fail the same way wherever they run): it is answered by a
restart where the job runs and counts toward its ``max_restarts``, never against a node. A fault
of a node's own hardware stays the node's wherever it recurs, and a drill's fault is nobody's.
Pure: :mod:`unicron.services.detector.record` reads the job and the drills, and records this.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unicron.services.detector.settings import DetectorSettings
from unicron.services.detector.signals import Candidate
from unicron.shared.contracts.models import FailureRecord, Job
from unicron.shared.contracts.taxonomy import (
    JOBS_FAULT,
    RecoveryAction,
    Severity,
    escalate,
    nodes_own,
    severity_of,
    users_code,
)


@dataclass(frozen=True)
class Grade:
    severity: Severity
    action: RecoveryAction
    follows_job: bool = False
    evidence: dict[str, str] = field(default_factory=dict)  # why it is not the taxonomy's


def grade(job: Job, cause: Candidate, settings: DetectorSettings, drilled: bool) -> Grade:
    """The grade of ``cause``, a failure of ``job``'s current generation; ``drilled``: a drill
    injected it or the failure it repeats."""
    severity, action = severity_of(cause.category)
    if action == RecoveryAction.REATTEMPT and not cause.lives_on:
        # The rank's process is gone or on its way out: there is no one to reattempt.
        action = RecoveryAction.RESTART
    last = repeated(job, cause, action, settings)
    if last is None:
        return Grade(severity, action)
    previous = {"previous_failure": last.failure_id}
    if follows_job(last, cause) and not drilled:
        return Grade(*JOBS_FAULT, follows_job=True, evidence=previous)
    escalated = escalate(last.action, action)
    return Grade(*escalated, evidence={"escalated_from": action.value, **previous})


def repeated(
    job: Job, cause: Candidate, action: RecoveryAction, settings: DetectorSettings
) -> FailureRecord | None:
    """The failure whose recovery ``cause`` says did not hold: the one its generation was
    started to recover from, within the escalation window. None for a new fault, an advisory
    one, or one of the job's own code (which never escalates)."""
    last = job.answered_failure()  # record() took only a cause of the current generation
    if last is None or action == RecoveryAction.REPORT or users_code(cause.category):
        return None
    # A recovery that trained on for ``escalation_steps`` worked: what fails later is a new
    # fault, not the same one coming back.
    proven = last.step is not None and job.step - last.step >= settings.escalation_steps
    late = cause.observed_at - last.observed_at > settings.escalation_window_s
    return None if proven or late else last


def follows_job(last: FailureRecord, cause: Candidate) -> bool:
    """``cause`` is ``last`` come back on another node, or come back again after it had."""
    if cause.category != last.category or nodes_own(cause.category):
        return False
    moved = cause.node_id is not None and cause.node_id != last.node_id
    return moved or last.follows_job
