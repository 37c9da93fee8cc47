"""A job's worker output: ``GET /v1/jobs/{id}/logs``, read through the node's agent.

The output of one rank in one generation lives on the node that ran it. The current
generation's placement is in ``job.workers``; an older generation's node is found by asking
every registered agent (only the one that ran it has the log). The first chunk is fetched
before the response starts, so a rank that never ran is a 404 and a silent agent a 503; the
rest streams as plain text, chunk by chunk, and with ``follow`` keeps asking from the last
offset until the worker has exited and its output is read, or the client goes away.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from unicron.services.api.access import Principal, may_see
from unicron.services.api.deps import BusDep, StateDep
from unicron.services.api.errors import errors
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.logs import MAX_TAIL_LINES, LogsReply, LogsRequest, logs_subject
from unicron.shared.contracts.models import Job
from unicron.shared.logging import get_logger
from unicron.shared.store.state import StateStore

router = APIRouter(prefix="/v1/jobs", tags=["logs"])
log = get_logger(component="api.logs")
REQUEST_TIMEOUT_S = 2.0
FOLLOW_POLL_S = 0.3
# A followed log ends after this many failed polls in a row (the node went away).
FOLLOW_FAILURES = 10


class AgentSilent(Exception):
    """The node's agent did not answer a logs request."""


async def ask(bus: Bus, node_id: str, request: LogsRequest) -> LogsReply:
    try:
        raw = await bus.request(
            logs_subject(node_id), request.model_dump_json().encode(), REQUEST_TIMEOUT_S
        )
    except Exception as exc:  # timeout, no responders, connection closed
        why = f"the agent of node {node_id} is not answering ({type(exc).__name__})"
        raise AgentSilent(why) from exc
    try:
        reply = LogsReply.model_validate_json(raw)
    except ValidationError as exc:  # a broken agent: refuse its reply, as for one that errs
        detail = f"node {node_id} sent a malformed logs reply: {exc.error_count()} errors"
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, detail) from None
    if reply.error is not None:
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, f"node {node_id}: {reply.error}")
    return reply


def _never_ran(job: Job, generation: int, rank: int, why: str) -> HTTPException:
    return HTTPException(
        status.HTTP_404_NOT_FOUND,
        f"rank {rank} of generation {generation} never ran for job {job.id}: {why} "
        f"(the job is at generation {job.generation})",
    )


async def locate(
    bus: Bus, state: StateStore, job: Job, request: LogsRequest
) -> tuple[str, LogsReply]:
    """The node that ran the request's rank and generation, and its first chunk."""
    generation, rank = request.generation, request.rank
    if not 1 <= generation <= job.generation:
        raise _never_ran(job, generation, rank, "no such generation")
    if generation == job.generation and job.workers:
        worker = next((w for w in job.workers if w.rank == rank), None)
        if worker is None:
            raise _never_ran(job, generation, rank, f"its ranks are 0-{len(job.workers) - 1}")
        try:
            reply = await ask(bus, worker.node_id, request)
        except AgentSilent as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc)) from None
        if not reply.found:
            raise HTTPException(
                status.HTTP_404_NOT_FOUND,
                f"rank {rank} of generation {generation} ({worker.state.value} on node "
                f"{worker.node_id}) has no output yet",
            )
        return worker.node_id, reply
    return await _search(bus, state, job, request)


async def _search(
    bus: Bus, state: StateStore, job: Job, request: LogsRequest
) -> tuple[str, LogsReply]:
    """Ask every registered agent: an older generation may have run on nodes the job left."""
    nodes = [n.id for n in await state.list_nodes()]
    replies = await asyncio.gather(*(ask(bus, n, request) for n in nodes), return_exceptions=True)
    silent = []
    for node_id, reply in zip(nodes, replies, strict=True):
        if isinstance(reply, LogsReply) and reply.found:
            return node_id, reply
        if isinstance(reply, AgentSilent):
            silent.append(node_id)
        elif isinstance(reply, BaseException):
            raise reply
    if silent:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"no answering node has rank {request.rank} of generation {request.generation}; "
            f"the agents of nodes {', '.join(silent)} are not answering",
        )
    raise _never_ran(job, request.generation, request.rank, "no node has its output")


async def stream(
    bus: Bus, node_id: str, request: LogsRequest, first: LogsReply, follow: bool
) -> AsyncIterator[bytes]:
    """The first chunk, then the rest up to the size seen at first (or on, with ``follow``)."""
    reply, end, failures = first, first.size, 0
    blog = log.bind(job_id=request.job_id, node_id=node_id, rank=request.rank)
    while True:
        if reply.data:
            yield reply.data
        if not follow and (reply.next_offset >= end or not reply.data):
            return
        if follow and reply.complete:
            return
        if follow and not reply.data:
            await asyncio.sleep(FOLLOW_POLL_S)
        more = request.model_copy(update={"offset": reply.next_offset, "tail": None})
        try:
            reply, failures = await ask(bus, node_id, more), 0
        except (AgentSilent, HTTPException) as exc:
            failures += 1
            if not follow or failures >= FOLLOW_FAILURES:
                blog.warning("log stream cut short", error=str(exc))
                return
            reply = reply.model_copy(update={"data": b""})


TEXT = {
    "description": "the rank's output",
    "content": {"text/plain": {"schema": {"type": "string"}}},
}


@router.get(
    "/{job_id}/logs",
    response_class=StreamingResponse,
    responses={200: TEXT, **errors(404, 422, 502)},
)
async def get_logs(
    job_id: str,
    bus: BusDep,
    state: StateDep,
    caller: Principal,
    rank: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    generation: Annotated[
        int | None, Query(ge=0, description="default: the job's latest generation")
    ] = None,
    tail: Annotated[int, Query(ge=0, le=MAX_TAIL_LINES, description="last N lines")] = 100,
    follow: Annotated[bool, Query(description="stream new output until the worker ends")] = False,
) -> StreamingResponse:
    """A rank's output (stdout and stderr) as plain text."""
    job = await state.get_job(job_id)
    if job is None or not may_see(caller, job):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id!r} not found")
    if generation is None:  # a job that gave up keeps no workers: its last ran one before
        generation = job.generation if job.workers else max(job.generation - 1, 0)
    request = LogsRequest(job_id=job.id, generation=generation, rank=rank, tail=tail)
    node_id, first = await locate(bus, state, job, request)
    return StreamingResponse(
        stream(bus, node_id, request, first, follow), media_type="text/plain; charset=utf-8"
    )
