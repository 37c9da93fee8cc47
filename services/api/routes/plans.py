"""Plans: the planner's latest decision and any earlier one, with its explanation.

A plan lists, per job, the old and new allocation and parallel configuration, the predicted
throughput, WAF and downtime, and the best alternatives that lost with their expected reward
(see ``unicron.shared.contracts.plans.JobExplanation``). Plans are kept in Redis for a week. A user
token sees only its tenant's jobs in a plan (the cluster-wide figures stay), and the plan's trigger
names no other tenant's job; an admin sees every job.
"""

from __future__ import annotations

import re

from fastapi import APIRouter, HTTPException, status
from unicron.services.api.access import Caller, Principal, may_see
from unicron.services.api.deps import StateDep
from unicron.services.api.errors import errors
from unicron.shared.contracts.plans import Plan
from unicron.shared.store.state import StateStore

router = APIRouter(prefix="/v1/plans", tags=["plans"])
OTHERS_JOB = "(another tenant's job)"
# Job ids are ``new_id("job")``; matching the shape also catches a job no longer listed.
_JOB_ID = re.compile(r"\bjob-[A-Za-z0-9_-]+")


def redact(text: str, visible: set[str], others: set[str]) -> str:
    """``text`` with every job id the caller may not see replaced: the ids of ``others``,
    and anything shaped like a job id that is not in ``visible``."""
    for job_id in sorted(others, key=len, reverse=True):  # longest first: no partial ids
        text = text.replace(job_id, OTHERS_JOB)
    return _JOB_ID.sub(lambda m: m[0] if m[0] in visible else OTHERS_JOB, text)


async def _scoped(plan: Plan, caller: Caller, state: StateStore) -> Plan:
    if caller.admin:
        return plan
    jobs = await state.list_jobs()
    visible = {job.id for job in jobs if may_see(caller, job)}
    others = {job.id for job in jobs} - visible
    # the planner names no other tenant's job in a reason; this holds if it ever did
    mine = [
        a.model_copy(update={"reason": redact(a.reason, visible, others)})
        for a in plan.allocations
        if a.job_id in visible
    ]
    trigger = redact(plan.trigger, visible, others)
    return plan.model_copy(update={"allocations": mine, "trigger": trigger})


@router.get("/latest", response_model=Plan, responses=errors(404))
async def latest_plan(state: StateDep, caller: Principal) -> Plan:
    """The plan the planner published last."""
    plan = await state.latest_plan()
    if plan is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            "no plan yet: the planner publishes one when a job or node needs it",
        )
    return await _scoped(plan, caller, state)


@router.get("/{plan_id}", response_model=Plan, responses=errors(404, 422))
async def get_plan(plan_id: str, state: StateDep, caller: Principal) -> Plan:
    plan = await state.get_plan(plan_id)
    if plan is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"plan {plan_id!r} not found (plans are kept for 7 days)",
        )
    return await _scoped(plan, caller, state)
