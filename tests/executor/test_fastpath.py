"""The fast path: a crash or a reattempt on the job's own nodes recovers without a new plan.

The job runs 4 ranks on n0 (0, 1) and n1 (2, 3) under a standing plan of the current planner
term; the failure arrives on the bus as the detector publishes it, and no planner runs.
"""

from __future__ import annotations

from unicron.services.executor.service import Executor
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import FailureDetected, TransitionStarted
from unicron.shared.contracts.messages import RegroupWorker, StartWorker
from unicron.shared.contracts.models import Job, JobState, NodeRecord, NodeState, PlanAction
from unicron.shared.contracts.plans import JobAllocation, Plan
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind
from unicron.shared.store.state import StateStore

from tests.executor.conftest import Events, FakeAgent, apply, fail, job_where, running_job

FOUR = ["n0", "n0", "n1", "n1"]


async def standing(state: StateStore, job: Job, nodes: list[str] = FOUR, epoch: int = 0) -> Plan:
    """The plan the job was started under: it is the latest, and places it on ``nodes``."""
    plan = Plan(
        seq=await state.next_plan_seq(), epoch=epoch,
        allocations=[JobAllocation(job_id=job.id, workers=len(nodes), nodes=nodes,
                                   action=PlanAction.START, generation=0)],
    )  # fmt: skip
    await state.save_plan(plan)
    return plan


def detected(job: Job, category: FailureCategory, rank: int, node: str) -> FailureDetected:
    """What the detector publishes after it recorded the failure (``fail``) on the job."""
    kind = FailureKind.CRASH if category == FailureCategory.EXITED_ABNORMALLY else "exception"
    return FailureDetected.of(
        category, failure_id=f"{job.id}:{job.generation}", job_id=job.id, node_id=node,
        rank=rank, generation=job.generation, kind=kind, observed_at=job.submitted_at + 1,
    )  # fmt: skip


async def test_a_crash_recovers_in_place_without_waiting_for_a_plan(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent], bus: Bus, events: Events
) -> None:
    job = await running_job(state, FOUR)
    plan = await standing(state, job)
    await fail(state, job.id, "restart", rank=2, dead=(2,))
    await bus.publish_event(detected(job, FailureCategory.EXITED_ABNORMALLY, 2, "n1"))

    started = await events.next(TransitionStarted, job_id=job.id, generation=2)
    assert (started.action, started.kind, started.plan_id) == (
        PlanAction.RESTART, "in_place", f"fast-{job.id}:1",
    )  # fmt: skip
    await agents["n1"].wait(lambda cs: any(isinstance(c, StartWorker) for c in cs))
    (joiner,) = agents["n1"].of(StartWorker)
    assert (joiner.generation, joiner.rank, joiner.state_source_rank) == (2, 2, 0)
    assert {c.from_rank for c in agents["n0"].of(RegroupWorker)} == {0, 1}
    after = await job_where(state, job.id, lambda j: j.generation == 2)
    assert after.recoveries == 1 and after.state == JobState.RECOVERING
    assert f"fast path within plan {plan.seq}" in after.history[-1].reason

    # The planner's plan for the same failure comes late, computed against generation 1: it
    # is stale for the job, and the crash is not answered twice.
    commands = len(agents["n1"].commands)
    await apply(executor, state, job, PlanAction.RESTART, FOUR)
    again = await state.get_job(job.id)
    assert again is not None and again.generation == 2 and again.recoveries == 1
    assert len(agents["n1"].commands) == commands


async def test_a_reattempt_regroups_the_same_ranks_at_once(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent], bus: Bus, events: Events
) -> None:
    job = await running_job(state, FOUR)
    await standing(state, job)
    await fail(state, job.id, "reattempt", rank=1, kind="exception")
    await bus.publish_event(detected(job, FailureCategory.CONNECTION_RESET, 1, "n0"))
    await events.next(TransitionStarted, job_id=job.id, generation=2)
    await agents["n1"].wait(lambda cs: len([c for c in cs if isinstance(c, RegroupWorker)]) == 2)
    assert agents["n0"].of(StartWorker) == [] and agents["n1"].of(StartWorker) == []


async def failed_on_a_standing_plan(
    state: StateStore, nodes: list[str] = FOUR, epoch: int = 0
) -> tuple[Job, FailureDetected]:
    job = await running_job(state, FOUR)
    await standing(state, job, nodes, epoch)
    await fail(state, job.id, "restart", rank=2, dead=(2,))
    return job, detected(job, FailureCategory.EXITED_ABNORMALLY, 2, "n1")


async def assert_left_to_the_planner(
    executor: Executor, state: StateStore, job: Job, failure: FailureDetected
) -> None:
    assert not await executor.fast_path.on_failure(failure)
    after = await state.get_job(job.id)
    assert after is not None and after.generation == 1 and after.state == JobState.RECOVERING


async def test_a_node_that_is_not_ready_leaves_the_recovery_to_the_planner(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    job, failure = await failed_on_a_standing_plan(state)

    def suspect(node: object) -> None:
        node.state = NodeState.QUARANTINED  # type: ignore[attr-defined]

    await state.update_node("n1", suspect)
    await assert_left_to_the_planner(executor, state, job, failure)


async def test_a_standing_plan_that_places_the_job_elsewhere_is_not_acted_on(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    job, failure = await failed_on_a_standing_plan(state, nodes=["n0", "n0", "n1", "n0"])
    await assert_left_to_the_planner(executor, state, job, failure)


async def test_a_plan_of_a_fenced_planner_term_is_no_standing_plan(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    lease = state.lease("planner", 5.0, instance="newer")
    assert await lease.try_acquire()  # a newer term: the stored plan's epoch 0 is fenced
    job, failure = await failed_on_a_standing_plan(state, epoch=0)
    await assert_left_to_the_planner(executor, state, job, failure)


async def test_a_failure_that_needs_a_reconfiguration_waits_for_the_planner(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    job, _ = await failed_on_a_standing_plan(state)
    ecc = detected(job, FailureCategory.ECC, 2, "n1")
    await assert_left_to_the_planner(executor, state, job, ecc)


async def test_a_job_wider_than_the_redis_clients_pool_recovers_on_the_fast_path(
    executor: Executor, state: StateStore, bus: Bus, events: Events
) -> None:
    """The fast path reads the nodes of the job in one go: a read per node, gathered, needed a
    connection each, past redis-py's pool of 100, and never went through."""
    wide = [f"w{i:03d}" for i in range(150)]
    for node_id in wide:
        await state.put_node(NodeRecord(id=node_id, slots=1, store_port=42000))
    job = await running_job(state, wide, job_id="job-wide")
    await standing(state, job, nodes=wide)
    await fail(state, job.id, "restart", rank=7, dead=(7,))
    await bus.publish_event(detected(job, FailureCategory.EXITED_ABNORMALLY, 7, "w007"))
    started = await events.next(TransitionStarted, job_id=job.id, generation=2)
    assert started.plan_id == f"fast-{job.id}:1"
