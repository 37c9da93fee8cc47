"""One active planner: a standby takes over when the active one dies; plans carry its epoch."""

from __future__ import annotations

import time
from pathlib import Path

from unicron.shared.contracts.models import PlanAction

from tests.planner.live import Live, epoch_reached, eventually, logged, summary


async def test_a_standby_planner_takes_over_within_the_lease_time(
    live: Live, tmp_path: Path
) -> None:
    ttl = 1.5
    active = live.start_planner(planner_lease_ttl_s=str(ttl))
    await live.submit("job-1", min_workers=2, max_workers=2)
    assert (await live.next_plan()).epoch == 1
    live.start_planner(planner_lease_ttl_s=str(ttl))
    await eventually(lambda: logged(tmp_path / "planner-1.log", "standing by"))
    await live.submit("job-2", min_workers=2, max_workers=2)
    assert (await live.next_plan()).epoch == 1  # still the first instance's plans

    active.kill()  # SIGKILL: its lease is left to expire
    killed = time.monotonic()
    await eventually(lambda: epoch_reached(live.state, 2), timeout_s=3 * ttl)
    assert time.monotonic() - killed <= 1.1 * ttl + 0.3
    await eventually(lambda: logged(tmp_path / "planner-1.log", "planner active"))
    await live.submit("job-3", min_workers=1, max_workers=1)
    plan = await live.next_plan()
    assert plan.epoch == 2 and "job-3" in summary(plan)
    assert summary(plan)["job-1"] == (PlanAction.START, 2)  # rebuilt from Redis, not memory
