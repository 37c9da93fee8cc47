"""Cluster state → plan: pure functions from Redis records to a plan draft.

:func:`snapshot` turns the records and the calibration into
:class:`~unicron.planning.api.ClusterInputs` (usable nodes, each job's demand and held ranks);
:func:`plan_cluster` applies the calibration to the objective, runs the DP, weighs the
alternatives, places the workers and names and explains each job's action;
:func:`needs_publish` says whether the draft is news compared with the latest plan. No I/O, no
clock: the service passes ``now``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, replace

from unicron.planning.allocation import allocate_units
from unicron.planning.api import (
    ACTIVE_STATES,
    Calibration,
    ClusterInputs,
    JobDemand,
    JobView,
    NodeView,
    Objective,
    Orphan,
    OutOfService,
)
from unicron.planning.explain import explain
from unicron.planning.fairness import PlanRules, waiting_since
from unicron.planning.objective import all_terms
from unicron.planning.placement import PlacementRequest, place
from unicron.planning.waiting import Waits
from unicron.shared.contracts.models import (
    FailureRecord,
    Job,
    JobState,
    NodeRecord,
    NodeState,
    PlanAction,
    WorkerState,
)
from unicron.shared.contracts.plans import Fairness, JobAllocation, Plan
from unicron.shared.contracts.transitions import QUIET as QUIET

# A rank holds its slot until it is stopped or done: a crashed process's slot is where its
# replacement restarts, so FAILED counts (its node must still be usable).
HOLDING = frozenset({WorkerState.LAUNCHING, WorkerState.RUNNING, WorkerState.FAILED})
# Processes that may still be running and so must be stopped for a terminal job.
LIVE = frozenset({WorkerState.LAUNCHING, WorkerState.RUNNING})
UNCALIBRATED = Calibration()
WAF_ONLY = PlanRules()


@dataclass(frozen=True)
class PlanDraft:
    """A plan before it gets its sequence number, epoch and trigger."""

    allocations: list[JobAllocation]
    free_slots: int
    expected_waf: float
    expected_reward: float = 0.0
    run_s: float = 0.0
    unit: int = 1
    planning_ms: float = 0.0
    fairness: Fairness = Fairness.WAF


def snapshot(
    nodes: Iterable[NodeRecord],
    jobs: Iterable[Job],
    now: float,
    calibration: Calibration = UNCALIBRATED,
    rules: PlanRules = WAF_ONLY,
) -> ClusterInputs:
    """The planning inputs: usable nodes by id, non-terminal jobs by submission time.

    A node is usable while READY: whether it still beats is the detector's call, made from
    what it could hear (:mod:`unicron.shared.store.hearing`); a planner reading heartbeats itself
    would read every node as silent the moment Redis came back from an outage."""
    slowdown = dict(calibration.job_slowdown)
    by_id = sorted(nodes, key=lambda n: n.id)
    jobs = list(jobs)
    recorded = {job.id for job in jobs}
    usable = tuple(
        NodeView(n.id, max(0, node_slots(n) - unrecorded_workers(n, recorded)), n.gpus)
        for n in by_id
        if n.state == NodeState.READY
    )
    usable_ids = {n.node_id for n in usable}
    out = tuple(
        OutOfService(n.id, node_slots(n), n.state.value) for n in by_id if n.id not in usable_ids
    )
    views: list[JobView] = []
    orphans: list[Orphan] = []
    for job in sorted(jobs, key=lambda j: (j.submitted_at, j.id)):
        if not job.state.terminal:
            view = job_view(job, usable_ids, slowdown.get(job.id, 1.0))
            views.append(replace(view, waited_s=rules.counted_wait(job, now)))
            continue
        live = sum(w.state in LIVE for w in job.workers)
        if live:
            orphans.append(Orphan(job.id, job.state, job.generation, live))
    # Slowdowns now live in the demands; the rest of the calibration is cluster-wide.
    cluster_wide = replace(calibration, job_slowdown=())
    return ClusterInputs(usable, tuple(views), tuple(orphans), cluster_wide, out)


def node_slots(node: NodeRecord) -> int:
    """Its slots, never more than its GPUs: one rank per GPU, as NCCL needs (its agent registers
    no more; a record that says otherwise is not believed)."""
    return min(node.slots, node.gpus) if node.gpus else node.slots


def unrecorded_workers(node: NodeRecord, recorded: Set[str]) -> int:
    """Workers the node's agent runs for jobs that have no record (Redis lost it and the
    executor has not rebuilt it yet, docs/design.md §6): their slots are taken all the same."""
    return sum(worker.job_id not in recorded for worker in node.workers)


def job_view(job: Job, usable: set[str], slowdown: float = 1.0) -> JobView:
    pending = job.state == JobState.PENDING
    ranks = () if pending else held_ranks(job, usable)
    faulted = not pending and job.needs_recovery()
    # Losing a rank's node hits the job like a fault: every choice costs it a transition.
    lost_rank = job.state in ACTIVE_STATES and len(ranks) < job.world_size
    demand = replace(
        JobDemand.of(job.id, job.spec),
        current=len(ranks),
        hit=faulted or lost_rank,
        world_size=0 if pending else job.world_size,
        recovery=job.last_failure.action if faulted and job.last_failure else None,
        resume=pending and job.step > 0,
        slowdown=slowdown,
    )
    failure = describe(job.last_failure) if faulted and job.last_failure else None
    return JobView(
        demand, job.state, job.world_size, job.generation, ranks, failure,
        tenant=job.tenant, waiting_since=waiting_since(job),
    )  # fmt: skip


def held_ranks(job: Job, usable: set[str]) -> tuple[str, ...]:
    """Node of each rank of the current world the job still holds on a usable node."""
    by_rank = {w.rank: w for w in job.workers if 0 <= w.rank < job.world_size}
    return tuple(
        by_rank[r].node_id
        for r in sorted(by_rank)
        if by_rank[r].state in HOLDING and by_rank[r].node_id in usable
    )


def describe(failure: FailureRecord) -> str:
    where = f" on {failure.node_id}" if failure.node_id else ""
    return (
        f"{failure.category.value}{where} (failure {failure.failure_id}, gen {failure.generation})"
    )


def calibrated(objective: Objective, inputs: ClusterInputs) -> Objective:
    """The objective with measured transition costs and D_run from the failure rate."""
    calibration = inputs.calibration
    cost = objective.cost.calibrated(dict(calibration.transition_factors))
    run_s = objective.run_s
    if calibration.failure_rate_per_gpu_h:
        run_s = run_time(calibration.failure_rate_per_gpu_h, inputs.capacity)
    return replace(objective, cost=cost, run_s=run_s)


def run_time(rate_per_gpu_h: float, gpus: int) -> float:
    """D_run: expected seconds to the next failure anywhere among ``gpus`` GPUs."""
    return 3600.0 / (rate_per_gpu_h * max(gpus, 1))


def plan_cluster(
    inputs: ClusterInputs, objective: Objective, rules: PlanRules = WAF_ONLY
) -> PlanDraft:
    """Allocate, place, name and explain an action for every job, plus a STOP per orphan."""
    started = time.perf_counter()
    capacity = inputs.capacity
    objective = calibrated(objective, inputs)
    terms = all_terms([v.demand for v in inputs.jobs], capacity, objective)
    count = capacity // objective.unit
    alloc = allocate_units(terms, inputs.jobs, rules, count, objective.unit)
    units = alloc.units
    workers = [t.workers(u) for t, u in zip(terms, units, strict=True)]
    requests = [
        PlacementRequest(v.job_id, x, v.ranks, group=max(1, int(t.curve.tp[u])))
        for v, x, t, u in zip(inputs.jobs, workers, terms, units, strict=True)
    ]
    nodes = place(inputs.nodes, requests)
    waits = Waits(inputs, terms, alloc, rules, objective.unit)
    allocations: list[JobAllocation] = []
    for i, view in enumerate(inputs.jobs):
        why = explain(terms[i], units[i], alloc.ks[i], alloc.totals[i], alloc.total)
        why.weight_factor = alloc.factors[i]
        why.guaranteed_workers = terms[i].workers(alloc.reserved[i])
        action, reason = decide(view, workers[i], nodes[view.job_id], capacity)
        waiting = waits.why(i) if workers[i] == 0 else None
        if waiting:
            reason = waiting[1] if action == PlanAction.WAIT else f"{reason}; waits: {waiting[1]}"
        allocations.append(
            JobAllocation(
                job_id=view.job_id,
                workers=workers[i],
                nodes=nodes[view.job_id],
                action=action,
                generation=view.generation,
                previous_workers=0 if view.state == JobState.PENDING else view.world_size,
                reason=reason,
                predicted_throughput=why.predicted_throughput,
                config=why.new_config,
                explanation=why,
                waiting_reason=waiting[0] if waiting else None,
                waiting_since=view.waiting_since,
            )
        )
    waf = sum(a.explanation.predicted_waf for a in allocations if a.explanation)
    allocations += [stop_orphan(o) for o in inputs.orphans]
    elapsed_ms = (time.perf_counter() - started) * 1e3
    free = capacity - sum(workers)
    return PlanDraft(
        allocations, free, waf, alloc.total, objective.run_s, objective.unit, elapsed_ms,
        rules.fairness,
    )  # fmt: skip


def decide(view: JobView, x: int, nodes: Sequence[str], capacity: int) -> tuple[PlanAction, str]:
    """The action that takes the job from what it runs now to ``x`` workers on ``nodes``."""
    if view.state == JobState.PENDING:
        if x:
            return PlanAction.START, f"start on {x} workers"
        return PlanAction.WAIT, "waiting for free slots"  # the plan says why (.waiting)
    if view.failure is not None:
        if x == 0:
            return PlanAction.STOP, f"{view.failure}; no room to restart, back to waiting"
        return PlanAction.RESTART, f"restart on {x} workers after {view.failure}"
    if x != view.world_size:
        if x == 0:
            return PlanAction.STOP, "preempted: its slots earn more expected WAF elsewhere"
        lost = len(view.ranks) < view.world_size
        why = "lost a node" if lost else "higher expected WAF"
        return PlanAction.RESIZE, f"resize {view.world_size}→{x} workers: {why}"
    if tuple(nodes) != view.ranks:
        moved = x - len(set(enumerate(nodes)) & set(enumerate(view.ranks)))
        return PlanAction.RESTART, f"{moved} of {x} ranks move off unusable nodes"
    return PlanAction.KEEP, "no change"


def stop_orphan(orphan: Orphan) -> JobAllocation:
    return JobAllocation(
        job_id=orphan.job_id,
        workers=0,
        action=PlanAction.STOP,
        generation=orphan.generation,
        previous_workers=orphan.workers,
        reason=f"job is {orphan.state.value}; stop its {orphan.workers} live workers",
    )


def needs_publish(draft: PlanDraft, latest: Plan | None) -> bool:
    """True when the draft asks for a change, or moves slots, and is not the latest again."""
    before = latest.allocations if latest else []
    if _signature(draft.allocations) == _signature(before):
        return False
    acts = any(a.action not in QUIET for a in draft.allocations)
    return acts or _placement(draft.allocations) != _placement(before)


def _signature(allocations: Iterable[JobAllocation]) -> set[tuple[object, ...]]:
    # Generation and reason (which names the failure) make a second fault of a job news,
    # though its action and placement are the same as for the first.
    return {
        (a.job_id, a.action, a.workers, tuple(a.nodes), a.generation, a.reason) for a in allocations
    }


def _placement(allocations: Iterable[JobAllocation]) -> dict[str, tuple[str, ...]]:
    return {a.job_id: tuple(a.nodes) for a in allocations if a.workers}
