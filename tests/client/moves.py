"""A job moved along its lifecycle as the executor moves it: the record first, then the event
that ``wait`` and the event stream see."""

from __future__ import annotations

from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import JobStateChanged
from unicron.shared.contracts.models import Job, JobState
from unicron.shared.store.state import StateStore

from tests.api.factories import moved


async def move(state: StateStore, bus: Bus, job_id: str, *states: JobState) -> Job:
    before = await state.get_job(job_id)
    assert before is not None, job_id
    job = await state.update_job(job_id, moved(*states))
    assert job is not None, job_id
    event = JobStateChanged.between(before, job)
    assert event is not None, (before.state, job.state)
    await bus.publish_event(event)
    return job
