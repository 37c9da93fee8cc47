"""The executor rebuilds the records of a Redis that lost its data, on real NATS and Redis: the
jobs come back from the event stream with the workers the agents report, orphans are stopped,
counters never go backwards, and stale messages change nothing afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from unicron.services.executor.progress import ProgressTracker
from unicron.services.executor.rebuild import Rebuilder, StateRebuildingError
from unicron.services.executor.settings import ExecutorSettings
from unicron.services.executor.transitions import TransitionRunner
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import (
    EventData,
    JobStateChanged,
    JobSubmitted,
    NodeJoined,
    NodeStateChanged,
    PlanCreated,
    TransitionCompleted,
    TransitionStarted,
)
from unicron.shared.contracts.messages import AGENT_COMMAND, StopWorkers, command_subject
from unicron.shared.contracts.models import (
    JobSpec,
    JobState,
    NodeRecord,
    NodeState,
    NodeWorker,
    PlanAction,
    WorkerState,
    now,
)
from unicron.shared.contracts.plans import JobAllocation, Plan
from unicron.shared.contracts.reports import StepCompleted, WorkerExited
from unicron.shared.store.lease import PLANNER_LEASE
from unicron.shared.store.state import StateStore

from tests.executor.conftest import FakeAgent
from tests.heartbeats import beating

SPEC = JobSpec(name="kept", steps=40, min_workers=1, max_workers=2)


async def publish(bus: Bus, *items: EventData) -> None:
    for item in items:
        await bus.publish_event(item)


def moved(job_id: str, old: JobState, new: JobState, generation: int, step: int) -> JobStateChanged:
    reason = f"to {new.value}"
    return JobStateChanged(
        job_id=job_id, old=old, new=new, reason=reason, step=step, generation=generation
    )


async def a_job_ran(bus: Bus, job_id: str, generation: int, ends: JobState | None = None) -> None:
    """The events of a job that started on 2 workers and stepped (and ended, with ``ends``)."""
    await publish(
        bus,
        JobSubmitted(job_id=job_id, name=SPEC.name, spec=SPEC, tenant="team-a"),
        TransitionStarted(
            job_id=job_id, plan_id=f"plan-{job_id}", action=PlanAction.START,
            generation=generation, from_workers=0, to_workers=2,
        ),
        moved(job_id, JobState.PENDING, JobState.STARTING, generation, 0),
        moved(job_id, JobState.STARTING, JobState.RUNNING, generation, 3),
        TransitionCompleted(
            job_id=job_id, action=PlanAction.START, generation=generation, world_size=2,
            resumed_step=0, duration_s=1.0, kind="checkpoint",
        ),
    )  # fmt: skip
    if ends is not None:
        await publish(bus, moved(job_id, JobState.RUNNING, ends, generation, 40))


@pytest.fixture
async def nodes(state: StateStore, bus: Bus) -> AsyncIterator[dict[str, FakeAgent]]:
    """Two agents' node records, each listing what it runs; they heartbeat every 50 ms."""
    for node_id in ("n0", "n1"):
        await bus.publish_event(NodeJoined(node_id=node_id, slots=2, host="h", boot_id="b"))
        await state.put_node(NodeRecord(id=node_id, slots=2, store_port=7000))
    agents = {n: FakeAgent(n) for n in ("n0", "n1")}
    for node_id, fake in agents.items():
        subject = command_subject(node_id)
        await bus.consume(subject, f"agent-{node_id}", AGENT_COMMAND.validate_json, fake.take)

    async with beating(state, agents, every_s=0.05):
        yield agents


async def runs(state: StateStore, node_id: str, *workers: tuple[str, int, int]) -> None:
    inventory = [NodeWorker(job_id=j, generation=g, rank=r, pid=100 + r) for j, g, r in workers]
    await state.update_node(node_id, lambda n: setattr(n, "workers", inventory))


@pytest.fixture
def rebuilder(bus: Bus, state: StateStore, tmp_path: Path) -> Rebuilder:
    return Rebuilder(bus, state, ExecutorSettings(data_dir=tmp_path, heartbeat_interval_s=0.1))


async def test_jobs_come_back_with_their_workers_and_orphans_are_stopped(
    bus: Bus, state: StateStore, nodes: dict[str, FakeAgent], rebuilder: Rebuilder
) -> None:
    await a_job_ran(bus, "job-a", generation=1)
    await publish(
        bus, PlanCreated(plan_id="p", seq=5, epoch=3, trigger="t", expected_waf=0, jobs=[])
    )
    await runs(state, "n0", ("job-a", 1, 0), ("job-x", 2, 0))  # job-x: no event names it
    await runs(state, "n1", ("job-a", 1, 1))
    quarantine = NodeStateChanged(
        node_id="n1", old=NodeState.READY, new=NodeState.QUARANTINED, until=now() + 600
    )
    await publish(bus, quarantine)
    handled: list[str] = []

    async def handler(item: str) -> None:
        handled.append(item)

    gated = rebuilder.gated(handler)
    with pytest.raises(StateRebuildingError):  # an outage: the bus holds the report
        await gated("held")
    await rebuilder.check()
    await gated("handled")
    assert handled == ["handled"]
    job = await state.get_job("job-a")
    assert job is not None and rebuilder.last is not None
    assert rebuilder.last.restored == ["job-a"]
    assert (job.spec, job.tenant, job.state, job.generation, job.step) == (
        SPEC, "team-a", JobState.RUNNING, 1, 3,
    )  # fmt: skip
    assert [(w.rank, w.node_id, w.state) for w in job.workers] == [
        (0, "n0", WorkerState.RUNNING),
        (1, "n1", WorkerState.RUNNING),
    ]
    await nodes["n0"].wait(lambda cmds: any(isinstance(c, StopWorkers) for c in cmds), 5)
    stop = nodes["n0"].of(StopWorkers)[0]
    assert (stop.job_id, stop.below_generation) == ("job-x", None)
    assert not nodes["n1"].of(StopWorkers)
    assert await state.next_plan_seq() == 6
    assert await state.current_epoch(PLANNER_LEASE) == 4
    assert await state.cluster_marker() is not None
    n1 = await state.get_node("n1")  # it re-registered READY: its quarantine is not over
    assert n1 is not None and (n1.state, n1.quarantined_until) == (
        NodeState.QUARANTINED, quarantine.until,
    )  # fmt: skip
    again = await rebuilder.rebuild()  # safe to repeat: every write is create-if-absent
    assert again.restored == [] and await state.get_job("job-a") == job


async def test_after_a_rebuild_stale_messages_change_nothing(
    bus: Bus, state: StateStore, nodes: dict[str, FakeAgent], rebuilder: Rebuilder
) -> None:
    await a_job_ran(bus, "job-done", generation=1, ends=JobState.SUCCEEDED)
    await a_job_ran(bus, "job-on", generation=2)
    await publish(
        bus, PlanCreated(plan_id="p", seq=2, epoch=1, trigger="t", expected_waf=0, jobs=[])
    )
    await runs(state, "n0", ("job-on", 2, 0))
    await runs(state, "n1", ("job-on", 2, 1))
    await rebuilder.check()
    progress = ProgressTracker(bus, state)
    late = {"node_id": "n0", "rank": 0, "loss": 1.0, "iteration_s": 0.1}
    await progress.on_report(StepCompleted(job_id="job-done", generation=1, step=5, **late))
    await progress.on_report(StepCompleted(job_id="job-on", generation=1, step=1, **late))
    exited = WorkerExited(node_id="n0", job_id="job-on", generation=1, rank=0, pid=1, exit_code=0)
    await progress.on_report(exited)
    done, running = await state.get_job("job-done"), await state.get_job("job-on")
    assert done is not None and (done.state, done.step) == (JobState.SUCCEEDED, 40)
    assert running is not None and (running.generation, running.step) == (2, 3)
    assert all(w.state == WorkerState.RUNNING for w in running.workers)
    # a plan of the planner's term before the loss is fenced off
    stale = Plan(
        seq=await state.next_plan_seq(), epoch=1,
        allocations=[JobAllocation(
            job_id="job-on", workers=1, nodes=["n0"], action=PlanAction.RESIZE, generation=2
        )],
    )  # fmt: skip
    await state.save_plan(stale)
    await TransitionRunner(bus, state, rebuilder.settings).apply_plan(stale)
    after = await state.get_job("job-on")
    assert after is not None and (after.generation, after.world_size) == (2, 2)


async def test_a_redis_that_kept_its_data_is_not_rebuilt_but_its_counters_are_raised(
    bus: Bus, state: StateStore, rebuilder: Rebuilder
) -> None:
    await state.mark_cluster("cluster-1")
    await publish(
        bus, PlanCreated(plan_id="p", seq=9, epoch=2, trigger="t", expected_waf=0, jobs=[])
    )
    await rebuilder.check()
    assert not rebuilder.pending and rebuilder.last is None
    assert await state.next_plan_seq() == 10
    assert await state.current_epoch(PLANNER_LEASE) == 2
