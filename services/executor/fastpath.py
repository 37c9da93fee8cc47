"""The fast path: a failure whose answer keeps the job's allocation is carried out at once.

A reattempt (SEV3) or the restart of a crashed rank (SEV2) on a job whose nodes are all still
usable changes nothing the planner decides: the job keeps its size and its nodes, and only its
generation moves on. Waiting for a global re-plan would add the planner's debounce, its reads
of the cluster and the DP to every such recovery (docs/design.md §5), so the executor carries
it out from the standing plan — the latest plan of the current planner term, which already puts
the job on exactly these nodes — without waiting for a new one.

The planner still hears the failure and plans. Its plan is the confirmation or the revision: one
computed before the fast path committed the next generation is stale for the job and skipped
(:mod:`unicron.services.executor.transitions`), one computed after it keeps the job or moves it
under the planner's fencing epoch like any other change. Whatever does not qualify — a node
that is not READY, a failure that calls for a reconfiguration, a standing plan that places the
job elsewhere or was made in a fenced term — waits for the planner as before.
"""

from __future__ import annotations

import asyncio

from unicron.services.executor.survivors import rank_nodes
from unicron.services.executor.transitions import TransitionRunner
from unicron.shared.contracts.events import FailureDetected
from unicron.shared.contracts.models import Job, JobState, NodeRecord, NodeState
from unicron.shared.contracts.plans import JobAllocation, Plan
from unicron.shared.contracts.taxonomy import RecoveryAction
from unicron.shared.contracts.transitions import PlanAction
from unicron.shared.logging import get_logger
from unicron.shared.store.lease import PLANNER_LEASE
from unicron.shared.store.state import StateStore

# Failure actions whose answer keeps the job's size and nodes (taxonomy.py: RECONFIGURE isolates
# a node and needs the planner; REPORT needs no transition).
FAST_ACTIONS = frozenset({RecoveryAction.REATTEMPT, RecoveryAction.RESTART})


def standing_allocation(
    failure: FailureDetected, job: Job, plan: Plan, nodes: dict[str, NodeRecord]
) -> JobAllocation | None:
    """The allocation that answers ``failure`` (a reattempt or a restart) on the job's own
    nodes, or None (with the reason logged at debug) when the planner must decide."""
    why_not = _why_not(failure, job, plan, nodes)
    if why_not is not None:
        get_logger(job_id=job.id).debug("fast path not taken", why=why_not)
        return None
    return JobAllocation(
        job_id=job.id,
        workers=job.world_size,
        nodes=rank_nodes(job),
        action=PlanAction.RESTART,
        generation=job.generation,
        previous_workers=job.world_size,
        reason=f"fast path: {failure.action.value} on its own nodes after {failure.category.value}",
    )


def _why_not(
    failure: FailureDetected, job: Job, plan: Plan, nodes: dict[str, NodeRecord]
) -> str | None:
    last = job.last_failure
    if last is None or last.failure_id != failure.failure_id or not job.needs_recovery():
        return "not the failure the job is recovering from"
    if job.state != JobState.RECOVERING or not job.stepping:
        return f"job {job.state.value}, stepping={job.stepping}"
    ranks = rank_nodes(job)
    if len(ranks) != job.world_size or not ranks:
        return "the job's workers do not fill its world"
    unusable = sorted({n for n in ranks if n not in nodes or nodes[n].state != NodeState.READY})
    if unusable:
        return f"nodes not ready: {', '.join(unusable)}"
    standing = next((a for a in plan.allocations if a.job_id == job.id), None)
    if standing is None or standing.nodes != ranks:
        return "the standing plan places the job elsewhere"
    return None


class FastPath:
    def __init__(self, state: StateStore, transitions: TransitionRunner) -> None:
        self.state = state
        self.transitions = transitions

    async def on_failure(self, failure: FailureDetected) -> bool:
        """Carry out ``failure``'s answer now if it keeps the allocation; True when it was
        handed to the transition (which does nothing if a plan carried it out first)."""
        if failure.job_id is None or failure.action not in FAST_ACTIONS:
            return False
        job, plan, epoch = await asyncio.gather(
            self.state.get_job(failure.job_id),
            self.state.latest_plan(),
            self.state.current_epoch(PLANNER_LEASE),
        )
        if job is None or plan is None or plan.epoch < epoch:
            return False  # no standing plan of the current term to act within
        # One read: a GET per node of an 8,192-rank job took a connection each, past the
        # client's pool of 100, and the executor lost its lease (bench/scale.py, 2,048 nodes).
        nodes = {n.id: n for n in await self.state.get_nodes(rank_nodes(job))}
        alloc = standing_allocation(failure, job, plan, nodes)
        if alloc is None:
            return False
        # Under an id of its own: the standing plan's id would make the planner's feedback
        # calibrate this restart as whatever that plan did for the job, and a replay of the
        # events read it as a fallback of the transition that plan started.
        fast = Plan(
            id=f"fast-{failure.failure_id}",
            seq=plan.seq,
            epoch=plan.epoch,
            trigger=f"failure {failure.failure_id}",
            allocations=[alloc],
        )
        await self.transitions.launch(
            alloc, fast, nodes, source=f"fast path within plan {plan.seq}"
        )
        return True
