"""Nodes: the cluster's nodes as their agents registered them.

A node's record lists the workers it runs (for the rebuild after a Redis loss); those name
jobs, so a user sees only its own tenant's (docs/design.md §6, Access).
"""

from __future__ import annotations

from fastapi import APIRouter
from unicron.services.api.access import Caller, Principal
from unicron.services.api.deps import StateDep
from unicron.shared.contracts.models import NodeRecord

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])


async def _scoped(node: NodeRecord, caller: Caller, state: StateDep) -> NodeRecord:
    if caller.admin or not node.workers:
        return node
    own = set()
    for job_id in {w.job_id for w in node.workers}:
        job = await state.get_job(job_id)
        if job is not None and job.tenant == caller.tenant:
            own.add(job_id)
    return node.model_copy(update={"workers": [w for w in node.workers if w.job_id in own]})


@router.get("", response_model=list[NodeRecord])
async def list_nodes(state: StateDep, caller: Principal) -> list[NodeRecord]:
    return [await _scoped(node, caller, state) for node in await state.list_nodes()]
