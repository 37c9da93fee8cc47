"""Helpers of the service tests: submitting jobs as the API does, and waiting on plans."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import JobSubmitted, PlanCreated
from unicron.shared.contracts.models import Job, JobSpec, PlanAction
from unicron.shared.contracts.plans import Plan
from unicron.shared.store.lease import PLANNER_LEASE, current_epoch
from unicron.shared.store.state import StateStore

WAIT_S = 15.0

StartPlanner = Callable[..., subprocess.Popen[bytes]]


@dataclass(frozen=True)
class Live:
    """One test's planner bench: planner processes to start, two READY nodes kept fresh, the
    store and the bus, and the plans the planners publish, in order."""

    start_planner: StartPlanner
    nodes: tuple[str, ...]
    state: StateStore
    bus: Bus
    plans: asyncio.Queue[PlanCreated]

    async def submit(self, job_id: str, announce: bool = True, **spec: float) -> Job:
        """Store a PENDING job and, unless ``announce`` is off, announce it as the API does."""
        job = Job(
            id=job_id,
            name=job_id,
            spec=JobSpec.model_validate({"name": job_id, "global_batch": 64, **spec}),
        )
        await self.state.create_job(job)
        if announce:
            await self.bus.publish_event(JobSubmitted(job_id=job.id, name=job.name, spec=job.spec))
        return job

    async def next_plan(self) -> Plan:
        event = await asyncio.wait_for(self.plans.get(), WAIT_S)
        plan = await self.state.get_plan(event.plan_id)
        assert plan is not None and plan.seq == event.seq
        return plan


def summary(plan: Plan) -> dict[str, tuple[PlanAction, int]]:
    return {a.job_id: (a.action, a.workers) for a in plan.allocations}


async def eventually(probe: Callable[[], Awaitable[bool]], timeout_s: float = WAIT_S) -> None:
    """Poll ``probe`` until it holds; fail after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while True:
            if await probe():
                return
            await asyncio.sleep(0.01)


async def epoch_reached(state: StateStore, epoch: int) -> bool:
    return await current_epoch(state.redis, PLANNER_LEASE, state.prefix) >= epoch


async def logged(path: Path, text: str) -> bool:
    content = await asyncio.to_thread(lambda: path.read_text() if path.exists() else "")
    return text in content
