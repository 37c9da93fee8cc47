"""A job or node record that no longer parses is skipped: the planner plans the others."""

from __future__ import annotations

import asyncio

from tests.planner.live import Live


async def test_the_planner_plans_around_unreadable_records(live: Live) -> None:
    state = live.state
    await state.redis.set(state._key("job", "job-garbage"), "not json at all")
    await state.redis.zadd(state._key("jobs"), {"job-garbage": 0.0})
    await state.redis.set(state._key("node", "node-garbage"), '{"id": "node-garbage"')
    await state.redis.sadd(state._key("nodes"), "node-garbage")
    live.start_planner()
    await live.submit("job-1", min_workers=1, max_workers=2)
    async with asyncio.timeout(20):
        while (plan := await live.next_plan()).for_job("job-1") is None:
            pass
    assert [a.job_id for a in plan.allocations] == ["job-1"]
    assert set(plan.for_job("job-1").nodes) <= set(live.nodes)  # type: ignore[union-attr]
