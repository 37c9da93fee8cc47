"""The planner's vocabulary: its inputs and the models it is parameterised by.

Everything here is an immutable value or a protocol, in the style of torch.distributed.elastic's
``api`` modules: the planning code depends on these and not on any implementation, so a
calibrated throughput model (best TP/PP/DP per worker count) or measured transition costs plug
in by implementing a protocol, without touching the DP or the service.

Inputs are frozen dataclasses of tuples so a whole cluster snapshot compares with ``==``: the
service re-plans only when the snapshot changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from shared.models import JobState

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Jobs an earlier plan placed: they hold (or are about to hold) workers.
ACTIVE_STATES = frozenset({JobState.STARTING, JobState.RUNNING, JobState.RECOVERING})


@dataclass(frozen=True)
class JobDemand:
    """What the objective needs to know about one job.

    ``current`` is x_old: the workers the job holds now on usable nodes. ``hit`` says the job
    pays its transition cost whatever it is given (a fault hit it, or it lost a rank's node).
    """

    job_id: str
    weight: float
    min_workers: int
    max_workers: int
    current: int = 0
    hit: bool = False

    def feasible(self, workers: IntArray) -> npt.NDArray[np.bool_]:
        """Hard constraints: nothing at all, or between min and max workers."""
        within = (workers >= self.min_workers) & (workers <= self.max_workers)
        feasible: npt.NDArray[np.bool_] = (workers == 0) | within
        return feasible


class ThroughputModel(Protocol):
    """T(t, x): achieved throughput of a job on each worker count, 0 below its minimum."""

    def throughput(self, demand: JobDemand, workers: IntArray) -> FloatArray: ...


class TransitionCost(Protocol):
    """D_trans(t, x_old → x) in seconds of lost work for each x; 0 where nothing changes."""

    def downtime(self, demand: JobDemand, workers: IntArray) -> FloatArray: ...


@dataclass(frozen=True)
class Objective:
    """The parameters of G(t, x) (DESIGN.md §4) and the allocation granularity.

    ``unit`` is the number of slots the DP hands out at once: 1 today, a node's slots when
    jobs must own whole nodes.
    """

    throughput: ThroughputModel
    cost: TransitionCost
    run_s: float
    unit: int = 1


@dataclass(frozen=True)
class NodeView:
    """A usable node (READY, fresh heartbeat) and its slots."""

    node_id: str
    slots: int


@dataclass(frozen=True)
class JobView:
    """A non-terminal job as the planner sees it.

    ``ranks`` holds the node of each rank the job still holds on a usable node, in rank order;
    ``failure`` describes the fault that hit the running generation, if any.
    """

    demand: JobDemand
    state: JobState
    world_size: int
    generation: int
    ranks: tuple[str, ...] = ()
    failure: str | None = None

    @property
    def job_id(self) -> str:
        return self.demand.job_id

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


@dataclass(frozen=True)
class Orphan:
    """A terminal job (cancelled, failed, done) that still has live workers to stop."""

    job_id: str
    state: JobState
    generation: int
    workers: int


@dataclass(frozen=True)
class ClusterInputs:
    """Everything a plan depends on; jobs in submission order (earlier wins ties)."""

    nodes: tuple[NodeView, ...]
    jobs: tuple[JobView, ...]
    orphans: tuple[Orphan, ...] = ()

    @property
    def capacity(self) -> int:
        return sum(n.slots for n in self.nodes)
