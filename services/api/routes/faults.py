"""Fault injection for tests, demos and drills: admin only.

``POST /v1/jobs/{id}/faults`` checks that the job runs and the rank is one of its current
workers, then sends an ``InjectFault`` command to the agent of the node that runs the rank.
The agent hands it to the worker, the worker fires it, and the detector reports the failure
like any other: the API never changes the job itself. Before sending, the API marks the job's
generation as drilled in Redis, so the detector never counts what the drill caused against
the node (no quarantine from drills).
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from fastapi.exceptions import RequestValidationError
from unicron.services.api.access import AdminPrincipal
from unicron.services.api.deps import BusDep, StateDep
from unicron.services.api.errors import errors
from unicron.shared.contracts.messages import FaultAccepted, FaultSpec, InjectFault
from unicron.shared.contracts.models import Job, JobState, WorkerRecord, WorkerState, new_id
from unicron.shared.logging import get_logger

router = APIRouter(prefix="/v1/jobs", tags=["faults"])
log = get_logger(component="api.faults")
INJECTABLE = (JobState.RUNNING, JobState.RECOVERING)
# Long enough for an ``at_step`` fault to fire in a slow generation; the mark names one
# generation, so a later real fault of the job is counted again.
DRILL_MARK_TTL_S = 24 * 3600


def _bad_rank(message: str) -> RequestValidationError:
    # Shaped like pydantic's own errors, so the client sees it as any other invalid field.
    return RequestValidationError(
        [{"loc": ("body", "rank"), "msg": message, "type": "value_error"}]
    )


def target_worker(job: Job, rank: int) -> WorkerRecord:
    """The running worker of ``rank`` in the job's current generation, or the 4xx saying why
    there is none."""
    live = [w for w in job.workers if w.state in (WorkerState.LAUNCHING, WorkerState.RUNNING)]
    if job.state not in INJECTABLE or not live:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"job {job.id} is {job.state.value} with {len(live)} live workers; faults can be "
            "injected only while it is RUNNING or RECOVERING with live workers",
        )
    worker = next((w for w in job.workers if w.rank == rank), None)
    if rank >= job.world_size or worker is None:
        ranks = sorted(w.rank for w in job.workers)
        raise _bad_rank(
            f"rank {rank} is not a worker of job {job.id} (world size {job.world_size}, "
            f"generation {job.generation}, ranks {ranks})"
        )
    if worker.state != WorkerState.RUNNING:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"rank {rank} of job {job.id} is {worker.state.value}, not RUNNING; "
            "a fault can only be delivered to a running worker",
        )
    return worker


@router.post(
    "/{job_id}/faults",
    status_code=status.HTTP_202_ACCEPTED,
    responses=errors(403, 404, 409, 422),
)
async def inject_fault(
    job_id: str, fault: FaultSpec, caller: AdminPrincipal, bus: BusDep, state: StateDep
) -> FaultAccepted:
    """Inject ``fault`` into one rank of a running job (admin only); 202 once it is sent."""
    job = await state.get_job(job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id!r} not found")
    worker = target_worker(job, fault.rank)
    command = InjectFault(
        command_id=new_id("cmd"),
        job_id=job.id,
        generation=job.generation,
        rank=fault.rank,
        fault=fault,
    )
    # Marked first: the failure the fault causes may be detected before send returns.
    await state.mark_drill(job.id, job.generation, command.command_id, DRILL_MARK_TTL_S)
    try:
        await bus.send_command(worker.node_id, command)
    except Exception as exc:
        log.error("fault not sent", job_id=job.id, node_id=worker.node_id, error=repr(exc))
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "the command bus is unavailable; the fault may not have been sent: check the job "
            "before repeating the request",
        ) from exc
    log.warning(
        "fault injected",
        fault_id=command.command_id,
        job_id=job.id,
        rank=fault.rank,
        node_id=worker.node_id,
        kind=fault.kind.value,
        by=caller.tenant,
    )
    return FaultAccepted(
        fault_id=command.command_id,
        job_id=job.id,
        generation=job.generation,
        rank=fault.rank,
        node_id=worker.node_id,
        kind=fault.kind,
        at_step=fault.at_step,
    )
