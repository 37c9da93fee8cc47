"""Carry out one plan: for each job, the transition from what runs to what the plan wants.

Each transition first commits the job's new generation and placement to Redis in one optimistic
transaction, then sends the agent commands. Applying the same plan twice finds the job already
at ``plan_id`` and does nothing; a plan computed against an older generation of a job is stale
for that job and skipped, so one failure never causes two restarts. A plan whose fencing epoch
is below the planner lease's current epoch is refused whole.
"""

from __future__ import annotations

from services.executor.commands import send_starts, send_stops
from services.executor.settings import ExecutorSettings
from shared.bus import Bus
from shared.events import JobStateChanged, TransitionStarted
from shared.lease import PLANNER_LEASE, current_epoch
from shared.logging import get_logger
from shared.models import (
    Job,
    JobAllocation,
    JobState,
    NodeRecord,
    Plan,
    PlanAction,
    WorkerRecord,
    WorkerState,
    now,
)
from shared.state import StateStore

_LAUNCHES = (PlanAction.START, PlanAction.RESTART, PlanAction.RESIZE)


class TransitionRunner:
    def __init__(self, bus: Bus, state: StateStore, settings: ExecutorSettings) -> None:
        self.bus = bus
        self.state = state
        self.settings = settings

    async def apply_plan(self, plan: Plan) -> None:
        # Fencing (DESIGN.md §6): a plan from a planner that has since lost its lease is void.
        epoch = await current_epoch(self.state.redis, PLANNER_LEASE, self.state.prefix)
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
        for allocation in plan.allocations:
            if allocation.action in _LAUNCHES:
                await self.launch(allocation, plan, nodes)
            elif allocation.action == PlanAction.STOP:
                await self.stop(allocation, plan, nodes)

    async def launch(self, alloc: JobAllocation, plan: Plan, nodes: dict[str, NodeRecord]) -> None:
        log = get_logger(job_id=alloc.job_id, plan_id=plan.id)
        before: Job | None = None
        give_up = False

        def prepare(job: Job) -> bool:
            nonlocal before, give_up
            if job.state.terminal or job.plan_id == plan.id or job.generation != alloc.generation:
                return False
            before = job.model_copy(deep=True)
            recovering = alloc.action != PlanAction.START or job.state != JobState.PENDING
            give_up = alloc.action == PlanAction.RESTART and (
                job.recoveries >= self.settings.max_recoveries
            )
            job.generation += 1
            job.plan_id = plan.id
            if give_up:
                job.workers = []
                job.world_size = 0
                job.set_state(JobState.FAILED, f"gave up after {job.recoveries} recoveries")
                return True
            job.world_size = alloc.workers
            job.workers = [WorkerRecord(rank=r, node_id=n) for r, n in enumerate(alloc.nodes)]
            job.transition_started_at = now()
            job.transition = alloc.action
            if alloc.action == PlanAction.RESTART:
                job.recoveries += 1
            job.set_state(
                JobState.RECOVERING if recovering else JobState.STARTING,
                f"plan {plan.seq}: {alloc.action.value} on {alloc.workers} workers",
            )
            return True

        job = await self.state.update_job(alloc.job_id, prepare)
        if job is None or before is None:
            return  # unknown job, already applied, or stale for this job
        old = before
        await send_stops(self.bus, job, sorted(nodes), job.generation, alloc.action.value)
        if not give_up:
            await send_starts(self.bus, job, nodes, self.settings.checkpoint_root)
            await self.bus.publish_event(
                TransitionStarted(
                    job_id=job.id,
                    plan_id=plan.id,
                    action=alloc.action,
                    generation=job.generation,
                    from_workers=old.world_size,
                    to_workers=job.world_size,
                )
            )
        await self._announce(old, job)
        log.info(
            "transition started",
            action=alloc.action.value,
            generation=job.generation,
            workers=job.world_size,
        )

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
                job.set_state(JobState.PENDING, f"plan {plan.seq}: preempted")
            return True

        job = await self.state.update_job(alloc.job_id, preempt)
        if job is None or before is None:
            return
        below = job.generation if not job.state.terminal else None
        await send_stops(self.bus, job, sorted(nodes), below, f"plan {plan.seq}: stop")
        await self._announce(before, job)

    async def _announce(self, old: Job, new: Job) -> None:
        event = JobStateChanged.between(old, new)
        if event is not None:
            await self.bus.publish_event(event)


def _live(worker: WorkerRecord) -> bool:
    return worker.state in (WorkerState.LAUNCHING, WorkerState.RUNNING)
