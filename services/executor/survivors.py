"""Which workers of a job survive a transition, and which rank each takes in the new generation.

Pure functions of a job, its allocation in a plan and the nodes, used by
:mod:`unicron.services.executor.transitions` (docs/design.md §5). A rank survives when its process
runs on a usable node and it is not the culprit of a failure that calls for more than a reattempt.
Survivors keep their rank where the plan keeps their node for it, fill the other ranks on their
node in placement order, and every rank left empty gets a joiner that takes the training state
from the survivor of the lowest new rank. A job whose rank finished the last step is left alone.
"""

from __future__ import annotations

from unicron.shared.contracts.models import (
    Job,
    JobState,
    NodeRecord,
    NodeState,
    WorkerRecord,
    WorkerState,
)
from unicron.shared.contracts.plans import JobAllocation
from unicron.shared.contracts.taxonomy import FailureKind, RecoveryAction
from unicron.shared.contracts.transitions import IN_PLACE_ACTIONS


def rank_nodes(job: Job) -> list[str]:
    """The node of each rank of the job's running generation, by rank."""
    return [w.node_id for w in sorted(job.workers, key=lambda w: w.rank)]


def finishing(job: Job) -> bool:
    """A rank of the running generation exited 0: it did the job's last step, and so (data
    parallel) did every rank; a plan that reads its finished slots as lost must not act."""
    return not job.needs_recovery() and any(w.state == WorkerState.SUCCEEDED for w in job.workers)


def failed_ranks(job: Job, nodes: dict[str, NodeRecord]) -> set[int]:
    """Ranks of the current generation that cannot take part in an in-place transition: the
    process is gone, its node is not usable, or it is the culprit of a failure that calls for
    more than a reattempt (a hung or faulty rank)."""
    failure = job.last_failure if job.needs_recovery() else None
    bad = set()
    for worker in job.workers:
        node = nodes.get(worker.node_id)
        if worker.state != WorkerState.RUNNING or node is None or node.state != NodeState.READY:
            bad.add(worker.rank)
    if failure is not None and failure.action != RecoveryAction.REATTEMPT:
        if failure.rank is not None:
            bad.add(failure.rank)
        if failure.kind == FailureKind.NODE_LOST and failure.node_id is not None:
            bad |= {w.rank for w in job.workers if w.node_id == failure.node_id}
    return bad


def in_place_workers(
    job: Job, alloc: JobAllocation, nodes: dict[str, NodeRecord]
) -> list[WorkerRecord] | None:
    """The new generation's workers with survivors kept in place, or None when that cannot
    apply (then every rank restarts from the checkpoint)."""
    if alloc.action not in IN_PLACE_ACTIONS or job.state == JobState.PENDING:
        return None
    if not job.stepping or job.state.terminal or not alloc.nodes:
        return None
    if job.step >= job.spec.steps:
        return None  # its workers are finishing: nothing left to keep them for
    bad = failed_ranks(job, nodes)
    survivors = sorted(
        (w for w in job.workers if w.rank not in bad and w.rank < job.world_size),
        key=lambda w: w.rank,
    )
    if not survivors:
        return None
    chosen: dict[int, WorkerRecord] = {}
    taken: set[int] = set()
    # keep a survivor's rank where the plan keeps its node for that rank …
    by_rank = {w.rank: w for w in survivors}
    for rank, node_id in enumerate(alloc.nodes):
        same = by_rank.get(rank)
        if same is not None and same.node_id == node_id:
            chosen[rank] = same
            taken.add(same.rank)
    # … and fill the other ranks in placement order from the survivors left on each node
    for rank, node_id in enumerate(alloc.nodes):
        if rank in chosen:
            continue
        spare = next((w for w in survivors if w.node_id == node_id and w.rank not in taken), None)
        if spare is not None:
            chosen[rank] = spare
            taken.add(spare.rank)
    if not chosen:
        return None
    joiners = len(chosen) < len(alloc.nodes)
    source = min(chosen) if joiners else None
    generation = job.generation
    workers = []
    for rank, node_id in enumerate(alloc.nodes):
        old = chosen.get(rank)
        if old is None:
            workers.append(WorkerRecord(rank=rank, node_id=node_id, state_source_rank=source))
        else:
            workers.append(
                WorkerRecord(
                    rank=rank,
                    node_id=node_id,
                    pid=old.pid,
                    state=WorkerState.RUNNING,
                    from_generation=generation,
                    from_rank=old.rank,
                    state_source_rank=source,
                )
            )
    return workers
