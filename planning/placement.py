"""Placement: each job's worker count → the node of each rank.

Two passes over the jobs, both in plan order, on one ledger of free slots per node:

1. every job keeps the ranks it holds on usable nodes, up to its new count (a job that keeps
   its size stays exactly where it is; one that shrinks or lost a node keeps its survivors) —
   moving a rank costs a restart of that process and a state transfer, which is never worth
   it for a count the job already has;
2. the ranks still missing are packed: onto nodes the job already uses, else onto the
   tightest node that fits them all, else the emptiest node (fill a node before the next), so
   a job spans as few nodes as it can.

With tensor parallelism of degree t (``group``), ranks r..r+t-1 form one TP group and must
share a node (NVLink): kept ranks are regrouped by node and each node keeps a multiple of t,
new ranks go to nodes in multiples of t; only when no node has t free slots does a group span
nodes. Nodes are visited in the order given (sorted by id) and ties go to the first, so the
same inputs always give the same placement. The ledger never goes below zero: a node is never
given more ranks than it has slots, even when the records claim otherwise — on a GPU node, never
two ranks on one GPU (NCCL refuses them; the snapshot counts no more slots than GPUs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from unicron.planning.api import NodeView


class PlacementError(RuntimeError):
    """More workers were asked for than the nodes have free slots."""


@dataclass(frozen=True)
class PlacementRequest:
    job_id: str
    workers: int
    ranks: tuple[str, ...] = ()  # node of each rank it holds now, in rank order
    group: int = 1  # tensor-parallel degree: ranks that must share a node


def place(nodes: Sequence[NodeView], requests: Sequence[PlacementRequest]) -> dict[str, list[str]]:
    """Node id of each rank, by rank, for every request; raises PlacementError if short."""
    free = {n.node_id: n.slots for n in nodes}
    kept = {r.job_id: _keep(r, free) for r in requests}
    placed: dict[str, list[str]] = {}
    for request in requests:
        ranks = kept[request.job_id]
        missing = request.workers - len(ranks)
        placed[request.job_id] = ranks + _pack(missing, ranks, free, request.group)
    return placed


def _keep(request: PlacementRequest, free: dict[str, int]) -> list[str]:
    """The ranks that stay where they are (renumbered from 0), whole TP groups per node."""
    if request.group <= 1:
        return _keep_in_order(request, free)
    held: dict[str, int] = {}
    for node in request.ranks:
        held[node] = held.get(node, 0) + 1
    kept: list[str] = []
    for node, count in held.items():
        take = min(count, free.get(node, 0), request.workers - len(kept))
        take -= take % request.group
        if take > 0:
            free[node] -= take
            kept += [node] * take
    return kept


def _keep_in_order(request: PlacementRequest, free: dict[str, int]) -> list[str]:
    kept: list[str] = []
    for node in request.ranks:
        if len(kept) == request.workers:
            break
        if free.get(node, 0) > 0:
            free[node] -= 1
            kept.append(node)
    return kept


def _pack(count: int, used: Sequence[str], free: dict[str, int], group: int) -> list[str]:
    ranks: list[str] = []
    mine = set(used)
    while count > 0:
        size = group if count % group == 0 else 1
        node = _pick(count, mine, free, size)
        if node is None and size > 1:
            size = 1  # no node has room for a whole TP group: it spans nodes
            node = _pick(count, mine, free, size)
        if node is None:
            raise PlacementError(f"no free slot left for {count} more workers")
        mine.add(node)
        take = min(free[node], count)
        take -= take % size
        free[node] -= take
        ranks += [node] * take
        count -= take
    return ranks


def _pick(count: int, used: Set[str], free: Mapping[str, int], size: int) -> str | None:
    open_nodes = [n for n, f in free.items() if f >= size]
    if not open_nodes:
        return None
    mine = [n for n in open_nodes if n in used]
    if mine:
        return mine[0]  # stay close to the job's other ranks
    fits = [n for n in open_nodes if free[n] >= count]
    if fits:
        return min(fits, key=lambda n: free[n])  # best fit keeps big holes for big jobs
    return max(open_nodes, key=lambda n: free[n])
