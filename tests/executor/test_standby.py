"""One active executor and a warm standby: the standby carries nothing out while the active one
lives, and takes over within the lease's TTL when it is killed, carrying out the next failure
from the standing plan (no planner runs)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import TransitionStarted
from unicron.shared.contracts.messages import StartWorker
from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.shared.store.lease import EXECUTOR_LEASE, current_epoch
from unicron.shared.store.state import StateStore

from tests.executor.conftest import Events, FakeAgent, fail, running_job
from tests.executor.test_fastpath import FOUR, detected, standing
from tests.planner.live import eventually, logged
from tests.services import StartService, service_processes

TTL_S = 1.5


@pytest.fixture
def start_executor(nats_url: str, redis_url: str, tmp_path: Path) -> Iterator[StartService]:
    with service_processes("executor", nats_url, redis_url, tmp_path) as start:
        yield start


async def crash_of_rank_2(state: StateStore, bus: Bus, job_id: str) -> None:
    """A running job of 4 ranks under a standing plan loses rank 2, as the detector says."""
    job = await running_job(state, FOUR, job_id=job_id)
    await standing(state, job)
    await fail(state, job.id, "restart", rank=2, dead=(2,))
    await bus.publish_event(detected(job, FailureCategory.EXITED_ABNORMALLY, 2, "n1"))


async def test_a_standby_executor_takes_over_within_the_lease_ttl(
    start_executor: StartService,
    state: StateStore,
    bus: Bus,
    agents: dict[str, FakeAgent],
    events: Events,
    tmp_path: Path,
) -> None:
    settings = {"executor_lease_ttl_s": str(TTL_S), "fast_path": "true"}
    active = start_executor(**settings)
    await eventually(lambda: logged(tmp_path / "executor-0.log", "executor active"))
    start_executor(**settings)
    await eventually(lambda: logged(tmp_path / "executor-1.log", "standing by"))

    await crash_of_rank_2(state, bus, "job-a")
    await events.next(TransitionStarted, job_id="job-a", generation=2, within=15)
    assert not await logged(tmp_path / "executor-1.log", "executor active")

    active.kill()  # SIGKILL: its lease is left to expire
    killed = time.monotonic()
    await eventually(lambda: _epoch_reached(state, 2), timeout_s=5 * TTL_S)
    assert time.monotonic() - killed <= 1.1 * TTL_S + 0.5
    await eventually(lambda: logged(tmp_path / "executor-1.log", "executor active"))

    await crash_of_rank_2(state, bus, "job-b")
    await events.next(TransitionStarted, job_id="job-b", generation=2, within=15)
    joiners = [c for c in agents["n1"].commands if isinstance(c, StartWorker)]
    assert {c.job_id for c in joiners} == {"job-a", "job-b"}


async def _epoch_reached(state: StateStore, epoch: int) -> bool:
    return await current_epoch(state.redis, EXECUTOR_LEASE, state.prefix) >= epoch
