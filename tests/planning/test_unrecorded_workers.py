"""A slot whose worker runs for a job with no record (Redis lost it, the executor has not
rebuilt it yet) is not free: a new job goes only where slots are. Pure: no servers."""

from __future__ import annotations

from unicron.planning.api import Objective
from unicron.planning.costs import ConstantDowntime
from unicron.planning.planning import plan_cluster, snapshot
from unicron.planning.throughput import LinearThroughput
from unicron.shared.contracts.models import Job, JobSpec, NodeRecord, NodeWorker, PlanAction

NOW = 10_000.0
OBJECTIVE = Objective(LinearThroughput(), ConstantDowntime(10.0, 10.0, 0.0), run_s=3600.0)


def node(node_id: str, *running: str) -> NodeRecord:
    workers = [
        NodeWorker(job_id=j, generation=1, rank=r, pid=100 + r) for r, j in enumerate(running)
    ]
    return NodeRecord(id=node_id, slots=2, last_heartbeat=NOW, workers=workers)


def test_a_new_job_is_placed_only_on_slots_no_unrecorded_worker_holds() -> None:
    new = Job(id="job-new", name="new", spec=JobSpec(name="new", min_workers=1, max_workers=4))
    # three ranks of a job whose record Redis lost: two on node-a, one on node-b
    nodes = [node("node-a", "job-lost", "job-lost"), node("node-b", "job-lost")]
    inputs = snapshot(nodes, [new], NOW)
    assert [(n.node_id, n.slots) for n in inputs.nodes] == [("node-a", 0), ("node-b", 1)]
    (allocation,) = plan_cluster(inputs, OBJECTIVE).allocations
    assert (allocation.action, allocation.nodes) == (PlanAction.START, ["node-b"])
