"""The planner never puts two ranks on one GPU: a GPU node's slots are its GPUs, whatever its
record claims, and a job that does not fit waits saying so. Pure: no servers."""

from __future__ import annotations

import random
from collections import Counter

from unicron.planning.planning import PlanDraft, plan_cluster, snapshot
from unicron.shared.contracts.models import (
    Job,
    JobSpec,
    JobState,
    NodeRecord,
    NodeWorker,
    WorkerState,
)
from unicron.shared.contracts.plans import WaitReason

from tests.planning.test_planning import NOW, OBJECTIVE, by_job, job


def gpu_node(node_id: str, gpus: int, slots: int | None = None) -> NodeRecord:
    slots = gpus if slots is None else slots
    return NodeRecord(id=node_id, slots=slots, gpus=gpus, last_heartbeat=NOW)


def plan(nodes: list[NodeRecord], jobs: list[Job]) -> PlanDraft:
    return plan_cluster(snapshot(nodes, jobs, NOW), OBJECTIVE)


def ranks_per_node(draft: PlanDraft) -> Counter[str]:
    return Counter(n for a in draft.allocations if a.workers for n in a.nodes)


def assert_one_rank_per_gpu(draft: PlanDraft, nodes: list[NodeRecord]) -> None:
    gpus = {n.id: n.gpus for n in nodes}
    for node_id, ranks in ranks_per_node(draft).items():
        assert ranks <= gpus[node_id], f"{ranks} ranks on {node_id}'s {gpus[node_id]} GPUs"


def running(job_id: str, lo: int, hi: int, ranks: tuple[str, ...], failed: bool = False) -> Job:
    held = job(job_id, lo, hi, state=JobState.RUNNING, ranks=ranks, failed=failed)
    if failed:
        held.workers[0].state = WorkerState.FAILED  # the crashed rank's slot is still its own
    return held


def test_the_planner_never_puts_two_ranks_on_one_gpu() -> None:
    """Random clusters and job mixes, planned and carried out round after round: no node ever
    gets more ranks than GPUs, whatever the jobs held before."""
    rng = random.Random(21)
    for _ in range(60):
        nodes = [gpu_node(f"node-{i}", rng.choice((1, 2, 4, 8))) for i in range(rng.randint(1, 4))]
        jobs = [job(f"job-{j}", lo=rng.randint(1, 4), hi=rng.randint(4, 16)) for j in range(5)]
        for _round in range(3):
            draft = plan(nodes, jobs)
            assert_one_rank_per_gpu(draft, nodes)
            placed = by_job(draft)
            jobs = [
                running(j.id, j.spec.min_workers, j.spec.max_workers, tuple(placed[j.id].nodes),
                        failed=rng.random() < 0.3)
                if placed[j.id].workers
                else job(j.id, j.spec.min_workers, j.spec.max_workers)  # preempted: pending
                for j in jobs
            ]  # fmt: skip


def test_a_record_claiming_more_slots_than_gpus_gets_one_rank_per_gpu() -> None:
    nodes = [gpu_node("node-a", gpus=2, slots=4)]  # an agent before one-rank-per-GPU, say
    assert [(n.node_id, n.slots, n.gpus) for n in snapshot(nodes, [], NOW).nodes] == [
        ("node-a", 2, 2)
    ]
    draft = plan(nodes, [job("job-1", lo=1, hi=4)])
    assert by_job(draft)["job-1"].nodes == ["node-a", "node-a"]


def test_ranks_a_job_holds_beyond_a_node_s_gpus_are_moved_not_kept() -> None:
    """A job recorded with three ranks on a node that has two GPUs now (it came back with fewer):
    the plan keeps two there and puts the third on another node's GPU."""
    nodes = [gpu_node("node-a", 2), gpu_node("node-b", 2)]
    held = running("job-1", 3, 3, ("node-a", "node-a", "node-a"), failed=True)
    got = by_job(plan(nodes, [held]))["job-1"]
    assert sorted(got.nodes) == ["node-a", "node-a", "node-b"]


def test_a_job_larger_than_the_gpus_waits_saying_one_worker_per_gpu() -> None:
    nodes = [gpu_node("node-a", 2), gpu_node("node-b", 1)]
    spec = JobSpec(name="big", min_workers=4, max_workers=4, global_batch=64)
    big = Job(id="job-9", name="big", spec=spec, submitted_at=NOW - 1)
    got = by_job(plan(nodes, [big]))["job-9"]
    assert (got.workers, got.waiting_reason) == (0, WaitReason.CLUSTER_TOO_SMALL)
    assert got.reason == "needs 4 workers (one per GPU), the cluster has 3 slots"


def test_workers_of_unrecorded_jobs_still_hold_their_gpus() -> None:
    node = gpu_node("node-a", 2)
    node.workers = [NodeWorker(job_id="job-gone", generation=1, rank=0, pid=7)]
    draft = plan([node], [job("job-1", lo=1, hi=2)])
    assert by_job(draft)["job-1"].nodes == ["node-a"]  # the other GPU is the lost job's rank's
