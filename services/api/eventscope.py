"""What of the event stream a caller may read, and what it asked to read: one answer for the
SSE route (routes/events.py) and for the webhooks (webhook_delivery.py).

A caller's :class:`EventFilter` is checked once, when it is asked for (:func:`check_filter`);
each event then passes :func:`visibility` (the caller's tenant) and the filter itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import HTTPException, status
from pydantic import ValidationError
from unicron.services.api.access import Caller, may_see
from unicron.shared.contracts.events import CloudEvent, PlanCreated
from unicron.shared.contracts.webhooks import EventFilter
from unicron.shared.store.state import StateStore

# A long stream remembers which jobs it may show; past this many it starts over.
VISIBILITY_CACHE = 10_000
# Events that name every tenant's jobs: an admin's alone.
ADMIN_ONLY_TYPES = (PlanCreated.TYPE,)
Visible = Callable[[CloudEvent], Awaitable[bool]]


def visibility(caller: Caller, state: StateStore) -> Visible:
    """Whether ``caller`` may see an event: an admin all; a user those about its tenant's jobs
    and about nodes, but not plans, which list every tenant's jobs."""
    seen: dict[str, bool] = {}  # a job's tenant never changes, so an answer stays true

    async def visible(event: CloudEvent) -> bool:
        if caller.admin:
            return True
        job_id = event.data.get("job_id")
        if not isinstance(job_id, str):
            return event.type.startswith("node.")
        if job_id not in seen:
            if len(seen) >= VISIBILITY_CACHE:
                seen.clear()
            seen[job_id] = await _sees_job(caller, state, job_id)
        return seen[job_id]

    return visible


async def _sees_job(caller: Caller, state: StateStore, job_id: str) -> bool:
    try:
        job = await state.get_job(job_id)
    except ValidationError:  # an unreadable record: its tenant is unknown, so hidden
        return False
    return job is not None and may_see(caller, job)


async def check_filter(caller: Caller, state: StateStore, wanted: EventFilter) -> None:
    """Refuse a filter that asks for what the caller may never see: 403 for an admin's event
    type, 404 for a job of another tenant (or none), the answer the job routes give."""
    if caller.admin:
        return  # an admin may follow a job whose record expired: its events are still kept
    refused = [t for t in wanted.types if t in ADMIN_ONLY_TYPES]
    if refused:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"only an admin token may read {', '.join(refused)} events: they name every "
            "tenant's jobs",
        )
    if wanted.job_id is not None and not await _sees_job(caller, state, wanted.job_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {wanted.job_id!r} not found")
