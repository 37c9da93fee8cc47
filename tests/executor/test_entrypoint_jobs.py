"""Entrypoint jobs in the executor: starts that carry the placement but never what to run, and
recovery that restarts every rank (a script that never stepped has nothing to keep in place)."""

from __future__ import annotations

from unicron.services.executor.commands import placement, start_commands
from unicron.services.executor.survivors import in_place_workers
from unicron.shared.contracts.models import (
    Job,
    JobSpec,
    JobState,
    NodeRecord,
    PlanAction,
    WorkerRecord,
    WorkerState,
)
from unicron.shared.contracts.plans import JobAllocation


def job_on(nodes: list[str], stepping: bool = False) -> Job:
    workers = [
        WorkerRecord(rank=r, node_id=n, pid=100 + r, state=WorkerState.RUNNING)
        for r, n in enumerate(nodes)
    ]
    spec = JobSpec(name="mine", entrypoint=["python", "train.py"], max_workers=4)
    return Job(
        id="job-1", name="mine", spec=spec, state=JobState.RUNNING, generation=3,
        world_size=len(nodes), workers=workers, stepping=stepping,
    )  # fmt: skip


def test_starts_carry_torchruns_placement_and_no_spec() -> None:
    job = job_on(["a", "b", "a", "b"])
    assert placement(job) == {0: (0, 2, 0), 1: (0, 2, 1), 2: (1, 2, 0), 3: (1, 2, 1)}
    nodes = {n: NodeRecord(id=n, slots=2, store_port=7000) for n in ("a", "b")}
    commands = start_commands(job, nodes)
    assert [(node, c.rank, c.local_rank, c.group_rank) for node, c in commands] == [
        ("a", 0, 0, 0), ("b", 1, 0, 1), ("a", 2, 1, 0), ("b", 3, 1, 1),
    ]  # fmt: skip
    # nothing to run and no path: the agent reads the one and derives the other
    assert all({"spec", "checkpoint_dir"}.isdisjoint(c.model_dump()) for _, c in commands)


def test_a_job_that_never_stepped_is_never_kept_in_place() -> None:
    job = job_on(["a", "b"], stepping=False)
    job.workers[1].state = WorkerState.FAILED
    nodes = {n: NodeRecord(id=n, slots=2) for n in ("a", "b")}
    alloc = JobAllocation(
        job_id="job-1", action=PlanAction.RESTART, workers=2, nodes=["a", "b"], generation=3
    )
    assert in_place_workers(job, alloc, nodes) is None
