"""One active planner: a standby takes over when the active one dies; plans carry its epoch."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.planner.live import (
    StartPlanner,
    epoch_reached,
    eventually,
    logged,
    next_plan,
    submit,
    summary,
)
from unicron.shared.bus import Bus
from unicron.shared.events import PlanCreated
from unicron.shared.models import PlanAction
from unicron.shared.state import StateStore


async def test_a_standby_planner_takes_over_within_the_lease_time(
    start_planner: StartPlanner,
    nodes: tuple[str, ...],
    state: StateStore,
    bus: Bus,
    plans: asyncio.Queue[PlanCreated],
    tmp_path: Path,
) -> None:
    ttl = 1.5
    active = start_planner(planner_lease_ttl_s=str(ttl))
    await submit(state, bus, "job-1", min_workers=2, max_workers=2)
    assert (await next_plan(plans, state)).epoch == 1
    start_planner(planner_lease_ttl_s=str(ttl))
    await eventually(lambda: logged(tmp_path / "planner-1.log", "standing by"))
    await submit(state, bus, "job-2", min_workers=2, max_workers=2)
    assert (await next_plan(plans, state)).epoch == 1  # still the first instance's plans

    active.kill()  # SIGKILL: its lease is left to expire
    killed = time.monotonic()
    await eventually(lambda: epoch_reached(state, 2), timeout_s=3 * ttl)
    assert time.monotonic() - killed <= 1.1 * ttl + 0.3
    await eventually(lambda: logged(tmp_path / "planner-1.log", "planner active"))
    await submit(state, bus, "job-3", min_workers=1, max_workers=1)
    plan = await next_plan(plans, state)
    assert plan.epoch == 2 and "job-3" in summary(plan)
    assert summary(plan)["job-1"] == (PlanAction.START, 2)  # rebuilt from Redis, not memory
