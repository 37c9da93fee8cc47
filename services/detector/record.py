"""Record a failure once: the ``failure.detected`` event and the job's ``last_failure``.

Safe to repeat: the event id is derived from (job, generation) so NATS drops a re-published
copy, and the job record is only changed while no failure is recorded for that generation.
"""

from __future__ import annotations

from services.detector.signals import Candidate
from shared.bus import Bus
from shared.events import FailureDetected, JobStateChanged
from shared.logging import get_logger
from shared.models import FailureRecord, Job, JobState
from shared.state import StateStore
from shared.taxonomy import severity_of


def _already_recorded(job: Job, generation: int) -> bool:
    return job.last_failure is not None and job.last_failure.generation == generation


class FailureRecorder:
    def __init__(self, bus: Bus, state: StateStore) -> None:
        self.bus = bus
        self.state = state

    async def record(self, cause: Candidate) -> FailureDetected | None:
        log = get_logger(job_id=cause.job_id, node_id=cause.node_id)
        job = await self.state.get_job(cause.job_id)
        if job is None or job.state.terminal or cause.generation != job.generation:
            log.info("stale failure report ignored", generation=cause.generation)
            return None
        if _already_recorded(job, cause.generation):
            return None
        severity, action = severity_of(cause.category)
        failure = FailureDetected(
            failure_id=f"{cause.job_id}:{cause.generation}",
            job_id=cause.job_id,
            node_id=cause.node_id,
            rank=cause.rank,
            generation=cause.generation,
            kind=cause.kind,
            category=cause.category,
            severity=severity,
            action=action,
            observed_at=cause.observed_at,
            evidence=cause.evidence,
        )
        await self.bus.publish_event(failure)

        marked = False

        def mark(j: Job) -> bool:
            nonlocal marked
            marked = False
            if j.generation != cause.generation or _already_recorded(j, cause.generation):
                return False
            j.last_failure = FailureRecord(
                failure_id=failure.failure_id,
                generation=cause.generation,
                kind=cause.kind.value,
                category=cause.category.value,
                severity=severity.value,
                action=action.value,
                rank=cause.rank,
                node_id=cause.node_id,
                observed_at=cause.observed_at,
            )
            j.set_state(JobState.RECOVERING, f"{cause.kind.value}: {cause.category.value}")
            marked = True
            return True

        updated = await self.state.update_job(cause.job_id, mark)
        log.warning(
            "failure detected",
            kind=cause.kind.value,
            category=cause.category.value,
            severity=severity.value,
            rank=cause.rank,
            latency_s=round(failure.detected_at - cause.observed_at, 4),
        )
        event = JobStateChanged.between(job, updated) if updated and marked else None
        if event is not None:
            await self.bus.publish_event(event)
        return failure
