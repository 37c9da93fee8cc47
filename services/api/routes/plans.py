"""Plans: the planner's latest decision and any earlier one, with its explanation.

A plan lists, per job, the old and new allocation and parallel configuration, the predicted
throughput, WAF and downtime, and the best alternatives that lost with their expected reward
(see ``shared.plans.JobExplanation``). Plans are kept in Redis for a week. A user token sees
only its tenant's jobs in a plan (the cluster-wide figures stay); an admin sees every job.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from unicron.services.api.access import Caller, Principal, may_see
from unicron.services.api.deps import StateDep
from unicron.shared.plans import Plan
from unicron.shared.state import StateStore

router = APIRouter(prefix="/v1/plans", tags=["plans"])


async def _scoped(plan: Plan, caller: Caller, state: StateStore) -> Plan:
    if caller.admin:
        return plan
    visible = {job.id for job in await state.list_jobs() if may_see(caller, job)}
    mine = [a for a in plan.allocations if a.job_id in visible]
    return plan.model_copy(update={"allocations": mine})


@router.get("/latest", response_model=Plan)
async def latest_plan(state: StateDep, caller: Principal) -> Plan:
    """The plan the planner published last."""
    plan = await state.latest_plan()
    if plan is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            "no plan yet: the planner publishes one when a job or node needs it",
        )
    return await _scoped(plan, caller, state)


@router.get("/{plan_id}", response_model=Plan)
async def get_plan(plan_id: str, state: StateDep, caller: Principal) -> Plan:
    plan = await state.get_plan(plan_id)
    if plan is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"plan {plan_id!r} not found (plans are kept for 7 days)",
        )
    return await _scoped(plan, caller, state)
