"""Each transition's commands, and the reports that end it, through real NATS and Redis.

A job runs 4 ranks on n0 (0, 1) and n1 (2, 3) unless a test says otherwise; fake agents record
the commands, and the test answers with the reports real agents and workers would send.
"""

from __future__ import annotations

import structlog
from unicron.services.executor.service import Executor
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import TransitionCompleted, TransitionStarted
from unicron.shared.contracts.messages import RegroupWorker, StartWorker, StopWorkers
from unicron.shared.contracts.models import Job, JobState, NodeState, PlanAction, WorkerState
from unicron.shared.contracts.reports import (
    StepCompleted,
    WorkerExited,
    WorkerRegrouped,
    WorkerStarted,
)
from unicron.shared.store.state import StateStore

from tests.executor.conftest import PORTS, Events, FakeAgent, apply, fail, job_where, running_job

FOUR = ["n0", "n0", "n1", "n1"]


def regroups(agent: FakeAgent) -> dict[int, tuple[int, int, int | None]]:
    """from_rank → (new generation, new rank, state_source_rank) of the node's regroups."""
    return {
        c.from_rank: (c.directive.generation, c.directive.rank, c.directive.state_source_rank)
        for c in agent.of(RegroupWorker)
    }


async def stopped(agent: FakeAgent, below: int) -> None:
    await agent.wait(lambda cs: any(isinstance(c, StopWorkers) for c in cs))
    stop = agent.of(StopWorkers)[-1]
    assert stop.below_generation == below


async def rank_1_reattempted(executor: Executor, state: StateStore) -> Job:
    """A running job on FOUR whose rank 1 raised, re-attempted in place by a plan."""
    job = await running_job(state, FOUR)
    await fail(state, job.id, "reattempt", rank=1, kind="exception")
    await apply(executor, state, job, PlanAction.RESTART, FOUR)
    return job


async def rank_2_restarted(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> Job:
    """A running job on FOUR whose rank 2 died, restarted by a plan; n1 stopped generation 1."""
    job = await running_job(state, FOUR)
    await fail(state, job.id, "restart", rank=2, dead=(2,))
    await apply(executor, state, job, PlanAction.RESTART, FOUR)
    await stopped(agents["n1"], below=2)
    return job


def regrouped(
    job_id: str, node: str, gen: int, rank: int, source: str, **kw: object
) -> WorkerRegrouped:
    return WorkerRegrouped(
        node_id=node, job_id=job_id, generation=gen, rank=rank, pid=2000 + rank, world_size=4,
        regroup_s=0.02, state_source=source, resumed_step=13, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_reattempt_regroups_the_same_ranks_in_place(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    job = await rank_1_reattempted(executor, state)
    for node in ("n0", "n1"):
        await stopped(agents[node], below=2)
        assert agents[node].of(StartWorker) == []
    assert regroups(agents["n0"]) == {0: (2, 0, None), 1: (2, 1, None)}
    assert regroups(agents["n1"]) == {2: (2, 2, None), 3: (2, 3, None)}
    directive = agents["n1"].of(RegroupWorker)[0].directive
    assert (directive.rendezvous.port, directive.rendezvous.prefix) == (PORTS["n0"], "job-r/g2/")
    assert directive.world_size == 4
    # commands of a node run in order: the regroups come before the stop of the old generation
    assert isinstance(agents["n0"].commands[-1], StopWorkers)
    after = await state.get_job(job.id)
    assert after is not None
    assert (after.generation, after.transition_kind, after.state) == (
        2,
        "in_place",
        JobState.RECOVERING,
    )
    assert [(w.from_rank, w.state) for w in after.workers] == [
        (r, WorkerState.RUNNING) for r in range(4)
    ]


async def test_restart_starts_a_joiner_and_regroups_survivors_then_completes(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent], bus: Bus, events: Events
) -> None:
    job = await rank_2_restarted(executor, state, agents)
    await stopped(agents["n0"], below=2)
    (joiner,) = agents["n1"].of(StartWorker)
    assert (joiner.generation, joiner.rank, joiner.world_size, joiner.state_source_rank) == (
        2,
        2,
        4,
        0,
    )
    assert joiner.rendezvous.prefix == "job-r/g2/" and joiner.rendezvous.port == PORTS["n0"]
    assert agents["n0"].of(StartWorker) == []
    assert regroups(agents["n0"]) == {0: (2, 0, 0), 1: (2, 1, 0)}
    assert regroups(agents["n1"]) == {3: (2, 3, 0)}
    # rank 2 has exited, its seat is free: its joiner starts first, while the others re-form
    assert [type(c) for c in agents["n1"].commands] == [StartWorker, RegroupWorker, StopWorkers]
    started = await events.next(TransitionStarted, job_id=job.id, generation=2)
    assert started.action == PlanAction.RESTART

    # the agents and workers answer: the joiner starts, all re-form, rank 0 steps
    await bus.publish_report(
        WorkerStarted(node_id="n1", job_id=job.id, generation=2, rank=2, pid=2002)
    )
    for rank, node in enumerate(FOUR):
        source = "peer" if rank == 2 else "memory"
        await bus.publish_report(regrouped(job.id, node, 2, rank, source, state_transfer_s=0.05))
    await bus.publish_report(
        StepCompleted(
            node_id="n0", job_id=job.id, generation=2, rank=0, step=13, loss=1.0, iteration_s=0.1
        )
    )
    done = await events.next(TransitionCompleted, job_id=job.id, generation=2)
    assert (done.kind, done.state_source, done.resumed_step, done.fallback) == (
        "in_place",
        "peer",
        12,
        None,
    )
    assert {"regroup", "state_transfer", "first_step"} <= set(done.phases)
    assert done.phases["state_transfer"] == 0.05
    after = await state.get_job(job.id)
    assert after is not None and after.state == JobState.RUNNING and after.stepping
    assert after.recoveries == 1

    # Generation 2 fails in turn: the steps its survivors still report end no transition.
    # (Its event would be dropped as a duplicate by the bus: the executor's log tells.)
    await fail(state, job.id, "restart", rank=3)
    with structlog.testing.capture_logs() as logs:
        for step in (14, 15):
            await bus.publish_report(
                StepCompleted(node_id="n0", job_id=job.id, generation=2, rank=0, step=step,
                              loss=1.0, iteration_s=0.1)
            )  # fmt: skip
        await job_where(state, job.id, lambda j: j.step == 15)
    assert [e for e in logs if e["event"] == "transition completed"] == []


async def test_node_loss_shrinks_by_compacting_the_survivors(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    job = await running_job(state, FOUR)

    def lost(node):  # type: ignore[no-untyped-def]
        node.state = NodeState.LOST
        return True

    await state.update_node("n0", lost)
    await fail(state, job.id, "reconfigure", rank=0, kind="node_lost", node_id="n0")
    await apply(executor, state, job, PlanAction.RESTART, ["n1", "n1"])
    await stopped(agents["n1"], below=2)
    assert agents["n1"].of(StartWorker) == []
    assert regroups(agents["n1"]) == {2: (2, 0, None), 3: (2, 1, None)}
    directive = agents["n1"].of(RegroupWorker)[0].directive
    assert (directive.world_size, directive.rendezvous.port) == (2, PORTS["n1"])
    assert agents["n0"].of(RegroupWorker) == []
    after = await state.get_job(job.id)
    assert after is not None
    assert [(w.rank, w.from_rank, w.node_id) for w in after.workers] == [(0, 2, "n1"), (1, 3, "n1")]


async def test_grow_adds_joiners_that_take_the_state_from_a_survivor(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    job = await running_job(state, ["n0", "n0"])
    await apply(executor, state, job, PlanAction.RESIZE, FOUR)
    await stopped(agents["n1"], below=2)
    await stopped(agents["n0"], below=2)
    assert regroups(agents["n0"]) == {0: (2, 0, 0), 1: (2, 1, 0)}
    assert [(s.rank, s.world_size, s.state_source_rank) for s in agents["n1"].of(StartWorker)] == [
        (2, 4, 0),
        (3, 4, 0),
    ]


async def test_no_survivors_restarts_every_rank_from_the_checkpoint(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    job = await running_job(state, FOUR)
    await fail(state, job.id, "restart", rank=0, dead=(0, 1, 2, 3))
    await apply(executor, state, job, PlanAction.RESTART, FOUR)
    for node in ("n0", "n1"):
        await agents[node].wait(lambda cs: len([c for c in cs if isinstance(c, StartWorker)]) == 2)
        assert agents[node].of(RegroupWorker) == []
        assert all(s.state_source_rank is None for s in agents[node].of(StartWorker))
    after = await state.get_job(job.id)
    assert after is not None and after.transition_kind == "checkpoint"


async def test_a_joiner_that_dies_falls_back_to_the_checkpoint(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent], bus: Bus, events: Events
) -> None:
    job = await rank_2_restarted(executor, state, agents)
    await bus.publish_report(
        WorkerStarted(node_id="n1", job_id=job.id, generation=2, rank=2, pid=2002)
    )
    await bus.publish_report(
        WorkerExited(
            node_id="n1", job_id=job.id, generation=2, rank=2, pid=2002, exit_code=None, signal=9
        )
    )
    # every rank of generation 3 starts from the checkpoint; generation 2 is stopped everywhere
    for node in ("n0", "n1"):
        await agents[node].wait(
            lambda cs: len([c for c in cs if isinstance(c, StartWorker) and c.generation == 3]) == 2
        )
        await stopped(agents[node], below=3)
        fresh = [c for c in agents[node].of(StartWorker) if c.generation == 3]
        assert all(c.state_source_rank is None for c in fresh)
        assert all(c.rendezvous.prefix == "job-r/g3/" for c in fresh)
    after = await state.get_job(job.id)
    assert after is not None
    assert (after.generation, after.transition_kind, after.recoveries) == (3, "checkpoint", 1)
    assert "in-place transition to generation 2 failed" in after.history[-1].reason
    assert (
        after.transition_fallback is not None and "exited (signal 9)" in after.transition_fallback
    )

    # a second exit report of the dead generation changes nothing; the restart completes
    await executor.transitions.fall_back(job.id, 2, "again")
    await bus.publish_report(
        StepCompleted(
            node_id="n0",
            job_id=job.id,
            generation=3,
            rank=0,
            step=11,
            loss=1.0,
            iteration_s=0.1,
            resumed_from=10,
        )
    )
    done = await events.next(TransitionCompleted, job_id=job.id, generation=3)
    assert (done.kind, done.state_source, done.resumed_step) == ("checkpoint", "disk", 10)
    assert done.fallback is not None and done.downtime_s is not None


async def test_a_failure_the_detector_recorded_of_the_regroup_is_left_to_the_plan(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    # A survivor that raised during the regroup (a fault the detector grades and the planner
    # answers, maybe elsewhere) must not also be restarted on the same placement.
    job = await rank_2_restarted(executor, state, agents)
    await fail(state, job.id, "reconfigure", rank=0, kind="exception")
    assert await executor.transitions.fall_back(job.id, 2, "g2 r0 on n0 exited (code 1)") is None
    after = await state.get_job(job.id)
    assert after is not None and after.generation == 2 and after.transition_fallback is None
    assert not [c for c in agents["n0"].of(StartWorker) if c.generation == 3]


async def test_a_transition_that_never_steps_falls_back_on_reconcile(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    job = await rank_1_reattempted(executor, state)
    await stopped(agents["n0"], below=2)

    def long_ago(j):  # type: ignore[no-untyped-def]
        j.transition_started_at -= 60
        return True

    await state.update_job(job.id, long_ago)
    await executor.reconcile()
    after = await state.get_job(job.id)
    assert after is not None and after.generation == 3 and after.transition_kind == "checkpoint"
    assert "no step" in (after.transition_fallback or "")


async def test_a_plan_that_reads_finished_ranks_as_lost_changes_nothing(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    job = await running_job(state, FOUR)

    def finished(j):  # type: ignore[no-untyped-def]
        j.workers[3].state = WorkerState.SUCCEEDED  # it did the last step and exited 0
        return True

    await state.update_job(job.id, finished)
    await apply(executor, state, job, PlanAction.RESIZE, ["n0", "n0", "n1"])
    after = await state.get_job(job.id)
    assert after is not None and after.generation == 1 and after.state == JobState.RUNNING
    assert agents["n0"].commands == [] and agents["n1"].commands == []
