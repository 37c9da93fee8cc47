"""The event stream as server-sent events: one SSE message per CloudEvent on the bus.

The SSE ``id`` is the JetStream stream sequence, so a client that reconnects with
``Last-Event-ID`` (browsers do this by themselves) resumes exactly after the last event it saw.
With ``follow=false`` the stream ends after the events stored when the request arrived.
A user (as opposed to an admin) sees only the events of its tenant's jobs and of nodes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, status
from pydantic import ValidationError
from sse_starlette import EventSourceResponse, ServerSentEvent
from unicron.services.api.access import Caller, Principal, may_see
from unicron.services.api.deps import BusDep, SettingsDep, StateDep
from unicron.services.api.errors import errors
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.store.state import StateStore

router = APIRouter(prefix="/v1/events", tags=["events"])
# In history mode stored events arrive back to back; a longer silence means the remaining
# messages were malformed ones that the bus skips, and waiting on would never end.
HISTORY_IDLE_S = 2.0
# A long stream remembers which jobs it may show; past this many it starts over.
VISIBILITY_CACHE = 10_000
Visible = Callable[[CloudEvent], Awaitable[bool]]


def _start_after(since: int | None, last_event_id: str | None, follow: bool) -> int | None:
    """The sequence to resume after; None means only new events."""
    if last_event_id is not None:  # a reconnect continues where it left off
        try:
            return max(int(last_event_id), 0)
        except ValueError:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                f"Last-Event-ID must be a stream sequence number, got {last_event_id!r}",
            ) from None
    if since is not None:
        return since
    return None if follow else 0


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
            try:
                job = await state.get_job(job_id)
            except ValidationError:  # an unreadable record: its tenant is unknown, so hidden
                job = None
            seen[job_id] = job is not None and may_see(caller, job)
        return seen[job_id]

    return visible


async def _sse(
    bus: Bus, after: int | None, end: int | None, visible: Visible
) -> AsyncIterator[ServerSentEvent]:
    if end is not None and (after or 0) >= end:
        return
    # tail_events is an async generator: closing it promptly removes its NATS consumer. It is
    # awaited in this task, never in one of wait_for's: a client that leaves cancels this task,
    # and a generator still running in another task could then not be closed.
    async with aclosing(bus.tail_events(after)) as events:
        while True:
            try:
                async with asyncio.timeout(None if end is None else HISTORY_IDLE_S):
                    seq, event = await anext(events)
            except TimeoutError:
                return
            if await visible(event):
                yield ServerSentEvent(event.model_dump_json(), id=str(seq), event=event.type)
            if end is not None and seq >= end:
                return


STREAM = {"description": "one SSE message per event", "content": {"text/event-stream": {}}}


@router.get("", response_class=EventSourceResponse, responses={200: STREAM, **errors(400, 422)})
async def stream_events(
    bus: BusDep,
    settings: SettingsDep,
    state: StateDep,
    caller: Principal,
    since: Annotated[int | None, Query(ge=0, description="replay after this sequence")] = None,
    follow: Annotated[bool, Query(description="keep streaming new events")] = True,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventSourceResponse:
    after = _start_after(since, last_event_id, follow)
    end = None if follow else await bus.last_event_seq()
    return EventSourceResponse(
        _sse(bus, after, end, visibility(caller, state)),
        ping=settings.api_sse_ping_s,
        send_timeout=30.0,
    )
