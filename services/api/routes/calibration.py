"""Calibration: what the planner has measured so far, in the form the simulator reads.

``GET /v1/calibration`` returns the snapshot the active planner stored at its last planning
pass (:class:`unicron.shared.contracts.calibration.CalibrationRecord`): per transition kind the
measured over modelled downtime, per job the observed over modelled step time, and the failure rate.
Save it and pass it to ``unicron simulate --calibration FILE`` to price simulated transitions with
the same numbers. A user token sees only its tenant's jobs' slowdowns; an admin sees all.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status
from unicron.services.api.access import Principal, may_see
from unicron.services.api.deps import StateDep
from unicron.services.api.errors import errors
from unicron.shared.contracts.calibration import CalibrationRecord

router = APIRouter(prefix="/v1/calibration", tags=["calibration"])


@router.get("", response_model=CalibrationRecord, responses=errors(404))
async def get_calibration(state: StateDep, caller: Principal) -> CalibrationRecord:
    record = await state.calibration.snapshot()
    if record is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            "no calibration yet: the planner stores one at its first planning pass",
        )
    if caller.admin:
        return record
    visible = {job.id for job in await state.list_jobs() if may_see(caller, job)}
    mine = {j: s for j, s in record.job_slowdown.items() if j in visible}
    return record.model_copy(update={"job_slowdown": mine})
