"""Saying what a plan is and why it was made: the ``plan.created`` event, the logs, the trigger.

A trigger text is short and human: the distinct events of a burst (the rest counted), or —
for a reconcile pass that found the cluster changed without an event — what it saw change
(a node became usable again after repair or quarantine, a node went away, a job appeared,
waiting jobs aged a step under the ``aging`` policy).
"""

from __future__ import annotations

from unicron.planning.api import ClusterInputs
from unicron.planning.planning import QUIET
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import PlanCreated, PlannedJob
from unicron.shared.contracts.plans import Plan
from unicron.shared.logging import get_logger

log = get_logger(component="planner")


def plan_created(plan: Plan) -> PlanCreated:
    return PlanCreated(
        plan_id=plan.id,
        seq=plan.seq,
        epoch=plan.epoch,
        trigger=plan.trigger,
        expected_waf=plan.expected_waf,
        jobs=[
            PlannedJob(
                job_id=a.job_id,
                action=a.action,
                workers=a.workers,
                previous_workers=a.previous_workers,
            )
            for a in plan.allocations
        ],
    )


async def announce(bus: Bus, plan: Plan) -> None:
    await bus.publish_event(plan_created(plan))
    log.info(
        "plan published",
        plan_id=plan.id,
        seq=plan.seq,
        epoch=plan.epoch,
        trigger=plan.trigger,
        expected_waf=plan.expected_waf,
        free_slots=plan.free_slots,
        planning_ms=round(plan.planning_ms, 1),
    )
    for a in plan.allocations:
        if a.action in QUIET:
            continue
        why = a.explanation
        get_logger(component="planner", job_id=a.job_id).info(
            "job planned",
            plan_id=plan.id,
            action=a.action.value,
            workers=a.workers,
            previous_workers=a.previous_workers,
            transition=why.transition if why else None,
            predicted_downtime_s=round(why.predicted_downtime_s, 3) if why else None,
            reason=a.reason,
        )


def summarise(triggers: list[str], reconcile: str, shown: int = 3) -> str:
    """A short trigger text: the distinct triggers in order, the rest counted."""
    distinct = list(dict.fromkeys(triggers)) or [reconcile]
    if len(distinct) > 1 and reconcile in distinct:
        distinct.remove(reconcile)
    text = ", ".join(distinct[:shown])
    more = len(distinct) - shown
    return f"{text} (+{more} more)" if more > 0 else text


def changes(before: ClusterInputs, after: ClusterInputs, shown: int = 3) -> str:
    """What changed between two snapshots, as a trigger text ("" when only details did)."""
    old_nodes = {n.node_id for n in before.nodes}
    new_nodes = {n.node_id for n in after.nodes}
    old_jobs = {v.job_id for v in before.jobs}
    new_jobs = {v.job_id for v in after.jobs}
    seen = [f"reconcile: node {n} usable" for n in sorted(new_nodes - old_nodes)]
    seen += [f"reconcile: node {n} unusable" for n in sorted(old_nodes - new_nodes)]
    seen += [f"reconcile: job {j} new" for j in sorted(new_jobs - old_jobs)]
    seen += [f"reconcile: job {j} gone" for j in sorted(old_jobs - new_jobs)]
    if not seen and before.calibration != after.calibration:
        seen.append("reconcile: calibration updated")
    waited = {v.job_id: v.waited_s for v in before.jobs}
    if not seen and any(waited.get(v.job_id, v.waited_s) != v.waited_s for v in after.jobs):
        seen.append("reconcile: waiting jobs aged")
    return summarise(seen, "", shown) if seen else ""
