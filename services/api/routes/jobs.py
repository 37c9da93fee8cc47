"""Jobs: submit, list, inspect and cancel.

A job is stored in Redis first and announced on the bus second: Redis is the record, the
event only wakes the planner. A replayed submission or cancellation publishes its event again
with the same deterministic id, so a request whose first attempt died between the two steps
is healed by a retry, while JetStream drops the copy when the first publish did get through.
A job whose ``working_dir`` names a package (``pkg://<sha256>``) is refused (422, nothing
created) unless that package was uploaded first (``POST /v1/packages``). The listing comes in
pages (:mod:`unicron.services.api.paging`); a finished job drops out of it, and 404s, once its
retention (``UNICRON_JOB_RETENTION_S``) has passed.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Response, status
from unicron.services.api import paging
from unicron.services.api.access import Caller, Principal, may_see
from unicron.services.api.deps import BusDep, SettingsDep, StateDep
from unicron.services.api.errors import errors
from unicron.shared.contracts.events import JobStateChanged, JobSubmitted
from unicron.shared.contracts.models import (
    HistoryEntry,
    Job,
    JobSpec,
    JobState,
    JobSummary,
    new_id,
)
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.logging import get_logger

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
log = get_logger(component="api.jobs")
CANCEL_REASON = "cancelled by user"


def _not_found(job_id: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id!r} not found")


async def _visible_job(state: StateDep, caller: Caller, job_id: str) -> Job:
    """The job, or 404 for one that does not exist or that the caller may not see: the same
    answer, so a user cannot probe for other tenants' job ids."""
    job = await state.get_job(job_id)
    if job is None or not may_see(caller, job):
        raise _not_found(job_id)
    return job


def _tenant_key(caller: Caller, key: str | None) -> str | None:
    """Idempotency keys are per tenant: another tenant's key must not return its job."""
    return key if key is None or caller.tenant is None else f"{caller.tenant}/{key}"


async def _announce(bus: BusDep, event: JobSubmitted | JobStateChanged, job_id: str) -> None:
    try:
        await bus.publish_event(event)
    except Exception as exc:
        log.error("event not published", job_id=job_id, type=event.TYPE, error=repr(exc))
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"job {job_id} was saved but the event bus is unavailable; "
            "repeat the request (with the same Idempotency-Key for a submission)",
        ) from exc


@router.post(
    "", status_code=status.HTTP_201_CREATED, response_model=Job, responses=errors(403, 422)
)
async def submit_job(
    spec: JobSpec,
    response: Response,
    bus: BusDep,
    state: StateDep,
    settings: SettingsDep,
    caller: Principal,
    idempotency_key: Annotated[str | None, Header(max_length=256)] = None,
) -> Job:
    """Store a new PENDING job of the caller's tenant and announce it; a repeated
    Idempotency-Key returns the first."""
    _check_weight(caller, spec, settings.api_user_max_weight)
    await _check_package(bus, spec)
    job = Job(
        id=new_id("job"),
        name=spec.name,
        spec=spec,
        tenant=caller.tenant,
        history=[HistoryEntry(state=JobState.PENDING, reason="submitted")],
    )
    job, created = await state.create_job(job, _tenant_key(caller, idempotency_key))
    if not created:
        if job.spec != spec:  # a reused key must not silently hand back some other job
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT,
                f"Idempotency-Key {idempotency_key!r} was used for job {job.id} with a "
                "different spec; use a new key for a new job",
            )
        response.headers["Idempotent-Replayed"] = "true"
    # Re-announce a replay only while nobody has acted on the job yet (see module docstring).
    if created or job.state == JobState.PENDING:
        submitted = JobSubmitted(job_id=job.id, name=job.name, spec=job.spec, tenant=job.tenant)
        await _announce(bus, submitted, job.id)
    log.info("job submitted", job_id=job.id, name=job.name, replayed=not created)
    return job


def _check_weight(caller: Caller, spec: JobSpec, limit: float) -> None:
    if caller.admin or spec.weight <= limit:
        return
    raise HTTPException(
        status.HTTP_403_FORBIDDEN,
        f"weight {spec.weight:g} is above {limit:g}, the most a user token may give a job "
        "(UNICRON_API_USER_MAX_WEIGHT); ask an admin for more",
    )


async def _check_package(bus: BusDep, spec: JobSpec) -> None:
    if spec.package is None:
        return
    try:
        present = await bus.has_package(spec.package)
    except Exception as exc:
        log.error("package store unavailable", error=repr(exc))
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, "the package store is unavailable; retry"
        ) from exc
    if not present:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"working_dir: package {spec.package} was not uploaded; "
            "upload it first (unicron submit --working-dir DIR does)",
        )


NEXT_PAGE = {
    paging.NEXT_CURSOR_HEADER: {
        "description": "the cursor of the next page; absent on the last one",
        "schema": {"type": "string"},
    }
}


@router.get(
    "",
    response_model=list[JobSummary],
    responses={200: {"headers": NEXT_PAGE}, **errors(422)},
)
async def list_jobs(
    response: Response,
    state: StateDep,
    caller: Principal,
    job_states: Annotated[
        list[JobState] | None,
        Query(alias="state", description="only jobs in these states (repeat for several)"),
    ] = None,
    limit: Annotated[
        int, Query(ge=1, le=paging.MAX_LIMIT, description="most jobs in this page")
    ] = paging.DEFAULT_LIMIT,
    cursor: Annotated[
        str | None,
        Query(max_length=paging.MAX_CURSOR_CHARS, description="X-Next-Cursor of the last page"),
    ] = None,
) -> list[JobSummary]:
    """The caller's jobs in submission order (an admin's: all), or only those in ``?state=``,
    a page at a time: follow ``X-Next-Cursor`` until a page comes without it. Each is a
    summary, without workers and history: ``GET /v1/jobs/{id}`` has them."""
    after = None if cursor is None else paging.decode_cursor(cursor)
    wanted = set(job_states or JobState)
    page = await paging.page_jobs(
        state, after, limit, lambda job: may_see(caller, job) and job.state in wanted
    )
    if page.next_after is not None:
        response.headers[paging.NEXT_CURSOR_HEADER] = paging.encode_cursor(page.next_after)
    return page.jobs


@router.get("/{job_id}", response_model=Job, responses=errors(404, 422))
async def get_job(job_id: str, state: StateDep, caller: Principal) -> Job:
    return await _visible_job(state, caller, job_id)


@router.post("/{job_id}/cancel", response_model=Job, responses=errors(404, 409, 422))
async def cancel_job(job_id: str, bus: BusDep, state: StateDep, caller: Principal) -> Job:
    """Move the job to CANCELLED; the planner and executor then stop its workers."""
    await _visible_job(state, caller, job_id)  # a job's tenant never changes: check it once
    before: list[JobState] = []

    def cancel(job: Job) -> bool:
        before[:] = [job.state]  # the last attempt of the optimistic transaction wins
        if job.state.terminal:
            return False
        return job.set_state(JobState.CANCELLED, CANCEL_REASON, by=ServiceRole.API)

    job = await state.update_job(job_id, cancel)
    if job is None:
        raise _not_found(job_id)
    if job.state != JobState.CANCELLED:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"job {job_id} already ended as {job.state.value}; it cannot be cancelled",
        )
    old = before[0] if before[0] != JobState.CANCELLED else _state_before_cancel(job)
    # old is never CANCELLED (see _state_before_cancel), so there is always a change to announce
    event = JobStateChanged.between(old, job, reason=CANCEL_REASON)
    if event is not None:
        await _announce(bus, event, job.id)
    log.info("job cancelled", job_id=job.id, old=old.value, replayed=before[0] == job.state)
    return job


def _state_before_cancel(job: Job) -> JobState:
    """For a repeated cancel: the state the first cancel left, so the event id is the same."""
    states = [entry.state for entry in job.history]
    while states and states[-1] == JobState.CANCELLED:
        states.pop()
    return states[-1] if states else JobState.PENDING
