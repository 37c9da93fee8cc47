"""The executor never starts a rank onto a GPU that another still holds: a joiner's start comes
after the stop that frees its device, and a plan that would put two ranks on one GPU of a node
is refused whole."""

from __future__ import annotations

from unicron.services.executor.service import Executor
from unicron.services.executor.transitions import crowded_gpus
from unicron.shared.contracts.messages import RegroupWorker, StartWorker, StopWorkers
from unicron.shared.contracts.models import Job, JobState, NodeRecord, PlanAction
from unicron.shared.contracts.plans import JobAllocation, Plan
from unicron.shared.store.state import StateStore

from tests.executor.conftest import PORTS, FakeAgent, apply, fail, running_job, spec

FOUR = ["n0", "n0", "n1", "n1"]


async def test_a_joiner_starts_after_the_stop_that_frees_its_gpu(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    """Rank 2 hung: its process still holds its GPU until the stop kills it, so on its node the
    survivor's regroup, then the stop, then the joiner's start."""
    job = await running_job(state, FOUR)
    await fail(state, job.id, "restart", rank=2, kind="hang")  # alive, but not a survivor
    await apply(executor, state, job, PlanAction.RESTART, FOUR)
    n1 = agents["n1"]
    await n1.wait(lambda cs: any(isinstance(c, StartWorker) for c in cs))
    assert [type(c) for c in n1.commands] == [RegroupWorker, StopWorkers, StartWorker]
    (joiner,) = n1.of(StartWorker)
    assert (joiner.generation, joiner.rank, n1.of(StopWorkers)[0].below_generation) == (2, 2, 2)


async def test_a_plan_that_puts_two_ranks_on_one_gpu_is_refused(
    executor: Executor, state: StateStore, agents: dict[str, FakeAgent]
) -> None:
    await state.put_node(
        NodeRecord(id="n0", slots=2, gpus=2, store_port=PORTS["n0"], boot_id="boot-n0")
    )
    job = Job(id="job-p", name="pending", spec=spec())
    await state.create_job(job)
    await apply(executor, state, job, PlanAction.START, ["n0", "n0", "n0"])
    after = await state.get_job(job.id)
    assert after is not None
    assert (after.state, after.generation, after.plan_id) == (JobState.PENDING, 0, None)
    # the next plan, one rank per GPU, is carried out
    await apply(executor, state, job, PlanAction.START, ["n0", "n0"])
    await agents["n0"].wait(lambda cs: len([c for c in cs if isinstance(c, StartWorker)]) == 2)
    # nothing came of the refused one: only the second plan's two starts (its seats were free,
    # so they went first) and its stop
    commands = agents["n0"].commands
    assert [type(c) for c in commands] == [StartWorker, StartWorker, StopWorkers]
    assert [c.rank for c in agents["n0"].of(StartWorker)] == [0, 1]


def test_only_gpu_nodes_are_held_to_one_rank_per_gpu() -> None:
    nodes = {
        "gpu": NodeRecord(id="gpu", slots=2, gpus=2),
        "old": NodeRecord(id="old", slots=4, gpus=2),  # a record claiming more slots than GPUs
        "cpu": NodeRecord(id="cpu", slots=2),
    }
    allocation = JobAllocation(
        job_id="j", workers=8, nodes=["gpu", "gpu", "old", "old", "old", "cpu", "cpu", "cpu"],
        action=PlanAction.START,
    )  # fmt: skip
    kept = JobAllocation(job_id="k", workers=1, nodes=["gpu"], action=PlanAction.KEEP)
    crowded = crowded_gpus(Plan(allocations=[allocation, kept]), nodes)
    assert crowded == ["gpu has 2 slots on 2 GPUs, given 3", "old has 4 slots on 2 GPUs, given 3"]
