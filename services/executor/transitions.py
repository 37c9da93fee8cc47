"""Carry out one plan: for each job, the transition from what runs to what the plan wants.

Healthy workers are kept (docs/design.md §5): when a recovering or resized job still has live
workers of a generation that stepped, they re-form in place under the new generation
(``RegroupWorker``) and only the missing ranks get new processes, joiners that take the state
from a surviving rank. A reattempt (SEV3) re-forms the same ranks with no state transfer; a
restart (SEV2) keeps the survivors' ranks and starts a joiner for each failed one; a resize or
a reconfiguration compacts the survivors into the new ranks in placement order. Whenever that
cannot apply (a job that never stepped, no survivor, a transition that fails before its first
step) the job falls back to stopping every worker and restarting from the checkpoint.

Each transition first commits the job's new generation and placement to Redis in one optimistic
transaction, then sends the agent commands. Applying the same plan twice finds the job already
at ``plan_id`` and does nothing; a plan computed against an older generation of a job is stale
for that job and skipped, so one failure never causes two restarts. A plan whose fencing epoch
is below the planner lease's current epoch is refused whole.
"""

from __future__ import annotations

from collections import Counter

from unicron.services.executor.commands import (
    MissingNodeError,
    send_generation,
    send_starts,
    send_stops,
    stop_targets,
)
from unicron.services.executor.settings import ExecutorSettings
from unicron.services.executor.survivors import finishing, in_place_workers, rank_nodes
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import JobStateChanged, TransitionStarted
from unicron.shared.contracts.models import (
    HistoryEntry,
    Job,
    JobState,
    NodeRecord,
    PlanAction,
    WorkerRecord,
    WorkerState,
    now,
)
from unicron.shared.contracts.plans import JobAllocation, Plan
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.contracts.transitions import LAUNCHES, TransitionMode
from unicron.shared.logging import get_logger
from unicron.shared.store.lease import PLANNER_LEASE
from unicron.shared.store.state import StateStore


def _frees_slots_first(alloc: JobAllocation) -> int:
    """Stops, then shrinks, then the rest: a node never runs a job's new workers while
    another job's workers it replaces are still on the slots (the sort keeps plan order)."""
    if alloc.action == PlanAction.STOP:
        return 0
    return 1 if alloc.workers < alloc.previous_workers else 2


def crowded_gpus(plan: Plan, nodes: dict[str, NodeRecord]) -> list[str]:
    """GPU nodes the plan gives more ranks than they have slots, each with its figures: NCCL
    refuses two ranks on one GPU, so such a plan is refused whole (a CPU node may run more)."""
    ranks = Counter(node for a in plan.allocations if a.workers for node in a.nodes)
    crowded = []
    for node_id, count in sorted(ranks.items()):
        node = nodes.get(node_id)
        if node is not None and node.gpus and count > min(node.slots, node.gpus):
            crowded.append(f"{node_id} has {node.slots} slots on {node.gpus} GPUs, given {count}")
    return crowded


class TransitionRunner:
    def __init__(self, bus: Bus, state: StateStore, settings: ExecutorSettings) -> None:
        self.bus = bus
        self.state = state
        self.settings = settings

    async def apply_plan(self, plan: Plan) -> None:
        # Fencing (docs/design.md §6): a plan from a planner that has since lost its lease is void.
        epoch = await self.state.current_epoch(PLANNER_LEASE)
        if plan.epoch < epoch:
            get_logger(plan_id=plan.id).warning(
                "stale plan refused", plan_epoch=plan.epoch, current_epoch=epoch
            )
            return
        latest = await self.state.latest_plan()
        if latest is not None and latest.seq > plan.seq:
            get_logger(plan_id=plan.id).info("superseded plan skipped", latest=latest.id)
            return
        nodes = {n.id: n for n in await self.state.list_nodes()}
        crowded = crowded_gpus(plan, nodes)
        if crowded:  # the nodes changed since it was computed; the planner plans again
            get_logger(plan_id=plan.id).error(
                "plan refused: two ranks would share a GPU", nodes="; ".join(crowded)
            )
            return
        for allocation in sorted(plan.allocations, key=_frees_slots_first):
            if allocation.action in LAUNCHES:
                await self.launch(allocation, plan, nodes)
            elif allocation.action == PlanAction.STOP:
                await self.stop(allocation, plan, nodes)

    async def launch(
        self,
        alloc: JobAllocation,
        plan: Plan,
        nodes: dict[str, NodeRecord],
        source: str | None = None,
    ) -> None:
        """Start the job's next generation as ``alloc`` says; ``source`` names what asked for
        it in the job's history (default: the plan's number)."""
        log = get_logger(job_id=alloc.job_id, plan_id=plan.id)
        source = source or f"plan {plan.seq}"
        before: Job | None = None
        give_up = False

        def prepare(job: Job) -> bool:
            nonlocal before, give_up
            before, give_up = None, False  # a retried transaction starts afresh
            if job.state.terminal or job.plan_id == plan.id or job.generation != alloc.generation:
                return False
            if alloc.action != PlanAction.START and finishing(job):
                return False  # a rank finished the last step: the others are about to
            before = job.model_copy(deep=True)
            kept = in_place_workers(job, alloc, nodes)
            recovering = alloc.action != PlanAction.START or job.state != JobState.PENDING
            give_up = alloc.action == PlanAction.RESTART and (
                job.recoveries >= self.settings.max_recoveries
            )
            job.generation += 1
            job.plan_id = plan.id
            if give_up:
                job.workers = []
                job.world_size = 0
                reason = f"gave up after {job.recoveries} recoveries"
                if not job.set_state(JobState.FAILED, reason, by=ServiceRole.EXECUTOR):
                    before = None  # refused (logged): leave the record as it was
                return before is not None
            job.world_size = alloc.workers
            fresh = [WorkerRecord(rank=r, node_id=n) for r, n in enumerate(alloc.nodes)]
            job.workers = kept if kept is not None else fresh
            job.transition_kind = (
                TransitionMode.CHECKPOINT if kept is None else TransitionMode.IN_PLACE
            )
            job.transition_fallback = None
            job.stepping = False
            job.transition_started_at = now()
            job.transition = alloc.action
            if alloc.action == PlanAction.RESTART:
                job.recoveries += 1
            reason = f"{source}: {alloc.action.value} on {alloc.workers} workers"
            if kept is not None:
                survivors = sum(w.survivor for w in kept)
                reason += (
                    f", in place as generation {job.generation}: {survivors} kept, "
                    f"{len(kept) - survivors} joining"
                )
            state = JobState.RECOVERING if recovering else JobState.STARTING
            if not job.set_state(state, reason, by=ServiceRole.EXECUTOR):
                if job.state != state:
                    before = None  # refused (logged): leave the record as it was
                    return False
                if kept is not None:  # a new attempt of the recovery under way
                    job.history.append(HistoryEntry(state=job.state, reason=reason))
            return True

        job = await self.state.update_job(alloc.job_id, prepare)
        if job is None or before is None:
            return  # unknown job, already applied, or stale for this job
        old = before
        await send_generation(self.bus, job, old, nodes, alloc.action.value, starting=not give_up)
        if not give_up:
            await self.bus.publish_event(
                TransitionStarted(
                    job_id=job.id,
                    plan_id=plan.id,
                    action=alloc.action,
                    generation=job.generation,
                    from_workers=old.world_size,
                    to_workers=job.world_size,
                    kind=job.transition_kind,
                )
            )
        await self._announce(old, job)
        log.info(
            "transition started",
            action=alloc.action.value,
            kind=job.transition_kind,
            generation=job.generation,
            workers=job.world_size,
            survivors=sum(w.survivor for w in job.workers),
        )

    async def fall_back(self, job_id: str, generation: int, why: str) -> Job | None:
        """Abandon an in-place transition to ``generation`` that has not stepped yet: stop every
        worker and restart all ranks from the checkpoint, on the same placement. Safe to call
        again (only the first call for a generation acts); returns the job when it acted. A
        failure the detector recorded for the generation is the plan's to answer, not this."""
        before: Job | None = None

        def restart(job: Job) -> bool:
            nonlocal before
            before = None
            if (
                job.generation != generation
                or job.transition_kind != TransitionMode.IN_PLACE
                or job.stepping
                or job.needs_recovery()
                or job.state.terminal
                or not job.workers
            ):
                return False
            before = job.model_copy(deep=True)
            job.generation += 1
            job.workers = [WorkerRecord(rank=r, node_id=n) for r, n in enumerate(rank_nodes(job))]
            job.transition_kind = TransitionMode.CHECKPOINT
            job.transition_fallback = why
            job.transition_started_at = now()
            reason = (
                f"in-place transition to generation {generation} failed ({why}); "
                f"generation {job.generation} restarts every rank from the checkpoint"
            )
            if not job.set_state(JobState.RECOVERING, reason, by=ServiceRole.EXECUTOR):
                if job.state != JobState.RECOVERING:
                    before = None  # refused (logged): leave the record as it was
                    return False
                job.history.append(HistoryEntry(state=job.state, reason=reason))
            return True

        job = await self.state.update_job(job_id, restart)
        if job is None or before is None:
            return None
        log = get_logger(job_id=job_id)
        log.warning("in-place transition failed; restarting from the checkpoint", why=why)
        nodes = {n.id: n for n in await self.state.list_nodes()}
        targets = stop_targets(job, before, nodes)
        await send_stops(self.bus, job, targets, job.generation, f"fallback: {why}")
        try:
            await send_starts(self.bus, job, nodes)
        except MissingNodeError:
            log.exception("cannot restart; the next plan will place the job again")
        await self.bus.publish_event(
            TransitionStarted(
                job_id=job.id,
                plan_id=job.plan_id or "",
                action=job.transition or PlanAction.RESTART,
                generation=job.generation,
                from_workers=before.world_size,
                to_workers=job.world_size,
                kind=TransitionMode.CHECKPOINT,
            )
        )
        await self._announce(before, job)
        return job

    async def stop(self, alloc: JobAllocation, plan: Plan, nodes: dict[str, NodeRecord]) -> None:
        before: Job | None = None

        def preempt(job: Job) -> bool:
            nonlocal before
            if job.plan_id == plan.id or not any(_live(w) for w in job.workers):
                return False
            before = job.model_copy(deep=True)
            job.plan_id = plan.id
            if not job.state.terminal:
                job.generation += 1  # the stopped workers' reports are now stale
                job.workers = []
                job.world_size = 0
                job.set_state(
                    JobState.PENDING, f"plan {plan.seq}: preempted", by=ServiceRole.EXECUTOR
                )
            return True

        job = await self.state.update_job(alloc.job_id, preempt)
        if job is None or before is None:
            return
        below = job.generation if not job.state.terminal else None
        targets = stop_targets(job, before, nodes)
        await send_stops(self.bus, job, targets, below, f"plan {plan.seq}: stop")
        await self._announce(before, job)

    async def _announce(self, old: Job, new: Job) -> None:
        event = JobStateChanged.between(old, new)
        if event is not None:
            await self.bus.publish_event(event)


def _live(worker: WorkerRecord) -> bool:
    return worker.state in (WorkerState.LAUNCHING, WorkerState.RUNNING)
