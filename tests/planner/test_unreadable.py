"""A job or node record that no longer parses is skipped: the planner plans the others."""

from __future__ import annotations

import asyncio

from tests.planner.live import StartPlanner, next_plan, submit
from unicron.shared.bus import Bus
from unicron.shared.events import PlanCreated
from unicron.shared.state import StateStore


async def test_the_planner_plans_around_unreadable_records(
    start_planner: StartPlanner,
    nodes: tuple[str, ...],
    state: StateStore,
    bus: Bus,
    plans: asyncio.Queue[PlanCreated],
) -> None:
    await state.redis.set(state._key("job", "job-garbage"), "not json at all")
    await state.redis.zadd(state._key("jobs"), {"job-garbage": 0.0})
    await state.redis.set(state._key("node", "node-garbage"), '{"id": "node-garbage"')
    await state.redis.sadd(state._key("nodes"), "node-garbage")
    start_planner()
    await submit(state, bus, "job-1", min_workers=1, max_workers=2)
    async with asyncio.timeout(20):
        while (plan := await next_plan(plans, state)).for_job("job-1") is None:
            pass
    assert [a.job_id for a in plan.allocations] == ["job-1"]
    assert set(plan.for_job("job-1").nodes) <= set(nodes)  # type: ignore[union-attr]
