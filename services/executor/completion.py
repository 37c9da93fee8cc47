"""The end of a transition: its generation's first step, announced as ``transition.completed``
with where the state came from, the step it resumed from and how long each phase took (detect,
plan, regroup, state transfer, first step)."""

from __future__ import annotations

from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import TransitionCompleted
from unicron.shared.contracts.models import FailureRecord, Job, PlanAction
from unicron.shared.contracts.reports import StepCompleted
from unicron.shared.contracts.transitions import StateSource, TransitionMode
from unicron.shared.logging import get_logger
from unicron.shared.store.state import StateStore


async def complete_transition(
    bus: Bus, state: StateStore, job: Job, report: StepCompleted
) -> TransitionCompleted:
    """Announce that ``job``'s generation took its first step (``report``); returns the event."""
    failure = job.answered_failure()
    downtime = report.at - failure.observed_at if failure is not None else None
    started = job.transition_started_at or report.at
    action = job.transition or PlanAction.START
    source, resumed = _state_source(job, report)
    phases = await _phases(state, job, report, failure, started)
    event = TransitionCompleted(
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
    await bus.publish_event(event)
    get_logger(job_id=job.id).info(
        "transition completed",
        generation=job.generation,
        kind=job.transition_kind,
        state_source=source,
        downtime_s=downtime,
        phases=phases,
    )
    return event


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
    state: StateStore,
    job: Job,
    report: StepCompleted,
    failure: FailureRecord | None,
    started: float,
) -> dict[str, float]:
    phases: dict[str, float] = {}
    detected = None
    if failure is not None and failure.detected_at is not None:
        detected = failure.detected_at
        phases["detect"] = max(0.0, detected - failure.observed_at)
    plan = await state.get_plan(job.plan_id) if job.plan_id else None
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
