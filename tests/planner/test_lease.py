"""The planner lease on real Redis: one holder, fencing epochs, takeover, stale plans refused."""

from __future__ import annotations

import asyncio
import time

from unicron.services.executor.settings import ExecutorSettings
from unicron.services.executor.transitions import TransitionRunner
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.models import Job, JobSpec, JobState, NodeRecord, PlanAction
from unicron.shared.contracts.plans import JobAllocation, Plan
from unicron.shared.store.lease import PLANNER_LEASE, Lease, LeaseState, current_epoch
from unicron.shared.store.state import StateStore
from unicron.shared.terms import renewing

TTL_S = 0.5


def lease(state: StateStore, holder: str) -> Lease:
    return Lease(state.redis, PLANNER_LEASE, TTL_S, holder=holder, prefix=state.prefix)


async def test_one_holder_at_a_time_and_each_new_holder_a_higher_epoch(state: StateStore) -> None:
    first, second = lease(state, "a"), lease(state, "b")
    assert await first.try_acquire() and first.epoch == 1 and first.held()
    assert not await second.try_acquire()
    assert second.state == LeaseState.STANDBY and not second.held()
    assert await first.try_acquire() and first.epoch == 1  # re-acquiring is renewing
    assert await first.renew()
    await first.release()
    assert first.state == LeaseState.RELEASED and not first.held()
    assert await second.try_acquire() and second.epoch == 2
    assert await current_epoch(state.redis, PLANNER_LEASE, state.prefix) == 2


async def test_a_standby_takes_over_within_the_ttl_and_the_old_holder_cannot_renew(
    state: StateStore,
) -> None:
    first, second = lease(state, "a"), lease(state, "b")
    assert await first.try_acquire()
    stop = asyncio.Event()
    started = time.monotonic()
    async with asyncio.timeout(5 * TTL_S):
        assert await second.acquire(stop)  # first stopped renewing: it "died" at `started`
    assert time.monotonic() - started <= 1.2 * TTL_S
    assert second.epoch == first.epoch + 1
    assert not await first.renew()  # it woke up too late: it is a standby now
    assert first.state == LeaseState.STANDBY and not first.held()


async def test_a_restarted_instance_takes_its_dead_predecessors_lease_at_once(
    state: StateStore,
) -> None:
    def of(instance: str, holder: str) -> Lease:
        return Lease(state.redis, PLANNER_LEASE, 60.0, holder, state.prefix, instance=instance)

    dead = of("planner@host", "pid-1")
    assert await dead.try_acquire()
    # another instance waits out the TTL (60 s here); the same instance, restarted, does not
    assert not await of("planner@other", "pid-2").try_acquire()
    successor = of("planner@host", "pid-3")
    assert await successor.try_acquire() and successor.epoch == dead.epoch + 1
    assert not await dead.renew()  # fenced: the predecessor's epoch is over


async def test_keep_renews_until_stopped(state: StateStore) -> None:
    holder, rival = lease(state, "a"), lease(state, "b")
    assert await holder.try_acquire()
    stop = asyncio.Event()
    keeping = asyncio.create_task(holder.keep(stop))
    await asyncio.sleep(3 * TTL_S)  # three TTLs: only renewals keep it ours
    assert not await rival.try_acquire() and holder.held()
    stop.set()
    async with asyncio.timeout(TTL_S):
        await keeping
    assert holder.state == LeaseState.ACTIVE  # stopping is not losing


async def test_the_executor_refuses_a_plan_from_a_deposed_planner(
    state: StateStore, bus: Bus
) -> None:
    await state.put_node(NodeRecord(id="node-a", slots=2))
    job = Job(id="job-1", name="job-1", spec=JobSpec(name="job-1"))
    await state.create_job(job)
    old, new = lease(state, "a"), lease(state, "b")
    assert await old.try_acquire()
    await old.release()
    assert await new.try_acquire()
    allocation = JobAllocation(
        job_id=job.id, workers=2, nodes=["node-a", "node-a"], action=PlanAction.START
    )
    runner = TransitionRunner(bus, state, ExecutorSettings())
    stale = Plan(seq=1, epoch=old.epoch, allocations=[allocation])
    await runner.apply_plan(stale)
    untouched = await state.get_job(job.id)
    assert untouched is not None and untouched.state == JobState.PENDING
    assert untouched.plan_id is None and untouched.generation == 0
    fresh = Plan(seq=2, epoch=new.epoch, allocations=[allocation])
    await state.save_plan(fresh)
    await runner.apply_plan(fresh)
    started = await state.get_job(job.id)
    assert started is not None and started.state == JobState.STARTING
    assert started.plan_id == fresh.id and started.world_size == 2


async def test_a_term_keeps_its_lease_through_a_set_up_longer_than_the_ttl(
    state: StateStore,
) -> None:
    """A new term binding its consumers on a loaded NATS cluster took longer than the TTL; its
    lease is renewed from the term's first line, so no standby takes the role meanwhile."""
    active, standby = lease(state, "a"), lease(state, "b")
    stop = asyncio.Event()
    assert await active.try_acquire()
    async with renewing(active, stop) as kept:
        await asyncio.sleep(3 * TTL_S)  # the set-up
        assert active.held() and not kept.done()
        assert not await standby.try_acquire()
    assert kept.cancelled()  # the term's end stops the renewals
