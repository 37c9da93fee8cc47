"""The cluster: which nodes are in service and which job holds how many of each node's GPUs.

One ledger, shared by every policy: a grant that would put more GPUs on a node than it has, or
any GPU on a node out of service, raises :class:`OverAllocation` — the simulator's safety net
for "GPUs are never over-allocated".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


class OverAllocation(AssertionError):
    """A policy tried to hand out GPUs that are not there."""


class ClusterState:
    def __init__(self, nodes: int, gpus_per_node: int) -> None:
        self.size, self.gpus_per_node = nodes, gpus_per_node
        self.up = [True] * nodes
        self.back_at = [0.0] * nodes  # when a node out of service returns
        self.held: list[dict[str, int]] = [{} for _ in range(nodes)]

    @property
    def gpus(self) -> int:
        return self.size * self.gpus_per_node

    def used(self, node: int) -> int:
        return sum(self.held[node].values())

    def free_nodes(self) -> list[int]:
        """Nodes in service that nobody holds any GPU of, in index order."""
        return [n for n in range(self.size) if self.up[n] and not self.held[n]]

    def usable_gpus(self) -> int:
        return sum(self.up) * self.gpus_per_node

    def holders(self, node: int) -> list[str]:
        return sorted(self.held[node])

    def nodes_of(self, job: str) -> list[int]:
        return [n for n in range(self.size) if job in self.held[n]]

    def gpus_of(self, job: str) -> int:
        return sum(h.get(job, 0) for h in self.held)

    def grant(self, job: str, node: int, gpus: int) -> None:
        if not self.up[node]:
            raise OverAllocation(f"{job} given GPUs on node {node}, which is out of service")
        if self.used(node) - self.held[node].get(job, 0) + gpus > self.gpus_per_node:
            raise OverAllocation(f"node {node} over-allocated: {self.held[node]} + {job}:{gpus}")
        if gpus:
            self.held[node][job] = gpus
        else:
            self.held[node].pop(job, None)

    def assign(self, job: str, ranks: Iterable[int]) -> None:
        """The job holds exactly one GPU per rank, on the node each rank names."""
        counts = Counter(ranks)
        for node in self.nodes_of(job):
            if node not in counts:
                self.held[node].pop(job, None)
        for node, gpus in sorted(counts.items()):
            self.grant(job, node, gpus)

    def assign_nodes(self, job: str, nodes: Iterable[int]) -> None:
        """The job holds all GPUs of each node given (and nothing else)."""
        self.assign(job, [n for n in nodes for _ in range(self.gpus_per_node)])

    def release(self, job: str) -> None:
        for held in self.held:
            held.pop(job, None)

    def fail(self, node: int, back_at: float) -> list[str]:
        """Take a node out of service until ``back_at``; the jobs that held GPUs on it."""
        jobs = self.holders(node)
        self.held[node] = {}
        self.up[node] = False
        self.back_at[node] = max(self.back_at[node], back_at)
        return jobs

    def repair(self, node: int, now: float) -> bool:
        """Back in service unless a later failure pushed its return further out."""
        if self.up[node] or self.back_at[node] > now + 1e-9:
            return False
        self.up[node] = True
        return True

    def check(self) -> None:
        for node, held in enumerate(self.held):
            if sum(held.values()) > self.gpus_per_node or (held and not self.up[node]):
                raise OverAllocation(f"node {node}: {held} (up={self.up[node]})")
