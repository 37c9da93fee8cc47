"""The event stream as server-sent events: one SSE message per CloudEvent on the bus.

The SSE ``id`` is the JetStream stream sequence, so a client that reconnects with
``Last-Event-ID`` (browsers do this by themselves) resumes exactly after the last event it saw.
With ``follow=false`` the stream ends after the events stored when the request arrived.
``type`` (repeatable) and ``job`` keep only those events (the filter webhooks use too); a user
(as opposed to an admin) sees only the events of its tenant's jobs and of nodes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sse_starlette import EventSourceResponse, ServerSentEvent
from unicron.services.api.access import Principal
from unicron.services.api.deps import BusDep, SettingsDep, StateDep
from unicron.services.api.errors import errors
from unicron.services.api.eventscope import Visible, check_filter, visibility
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import EVENT_TYPES
from unicron.shared.contracts.webhooks import EventFilter

router = APIRouter(prefix="/v1/events", tags=["events"])
# In history mode stored events arrive back to back; a longer silence means the remaining
# messages were malformed ones that the bus skips, and waiting on would never end.
HISTORY_IDLE_S = 2.0


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


def _filter(types: list[str], job: str | None) -> EventFilter:
    """The query's filter; a bad one is a 422 naming the parameter (``type``, ``job``)."""
    try:
        return EventFilter(types=types, job_id=job)
    except ValidationError as exc:
        query_name = {"types": "type", "job_id": "job"}
        raise RequestValidationError(
            [{**e, "loc": ("query", query_name.get(str(e["loc"][0]), e["loc"][0]))}
             for e in exc.errors()]
        ) from None  # fmt: skip


async def _sse(
    bus: Bus, after: int | None, end: int | None, wanted: EventFilter, visible: Visible
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
            if wanted.matches(event) and await visible(event):
                yield ServerSentEvent(event.model_dump_json(), id=str(seq), event=event.type)
            if end is not None and seq >= end:
                return


STREAM = {"description": "one SSE message per event", "content": {"text/event-stream": {}}}


@router.get(
    "", response_class=EventSourceResponse, responses={200: STREAM, **errors(400, 403, 404, 422)}
)
async def stream_events(
    bus: BusDep,
    settings: SettingsDep,
    state: StateDep,
    caller: Principal,
    since: Annotated[int | None, Query(ge=0, description="replay after this sequence")] = None,
    follow: Annotated[bool, Query(description="keep streaming new events")] = True,
    last_event_id: Annotated[str | None, Header()] = None,
    event_type: Annotated[
        list[str] | None,
        Query(alias="type", description=f"keep these types (repeat it): {', '.join(EVENT_TYPES)}"),
    ] = None,
    job: Annotated[str | None, Query(description="keep the events about this job")] = None,
) -> EventSourceResponse:
    wanted = _filter(event_type or [], job)
    await check_filter(caller, state, wanted)
    after = _start_after(since, last_event_id, follow)
    end = None if follow else await bus.last_event_seq()
    return EventSourceResponse(
        _sse(bus, after, end, wanted, visibility(caller, state)),
        ping=settings.api_sse_ping_s,
        send_timeout=30.0,
    )
