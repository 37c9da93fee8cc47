"""The planner's vocabulary: its inputs, the models it is parameterised by, and their outputs.

Everything here is an immutable value or a protocol, in the style of torch.distributed.elastic's
``api`` modules: the planning code depends on these and not on any implementation, so a
throughput model (linear, or the calibrated Megatron-style model of :mod:`.throughput`) or a
transition-cost model plugs in by implementing a protocol, without touching the DP or the
service. Model shapes and cluster descriptions live in :mod:`.spec`; the kinds of transition
and state sources are the shared ones of :mod:`unicron.shared.contracts.transitions`.

Inputs are frozen dataclasses of tuples so a whole cluster snapshot compares with ``==``: the
service re-plans only when the snapshot changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt
from unicron.planning.spec import ModelShape
from unicron.shared.contracts.models import JobSpec, JobState
from unicron.shared.contracts.taxonomy import RecoveryAction
from unicron.shared.contracts.transitions import StateSource as StateSource
from unicron.shared.contracts.transitions import TransitionKind as TransitionKind

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Jobs an earlier plan placed: they hold (or are about to hold) workers.
ACTIVE_STATES = frozenset({JobState.STARTING, JobState.RUNNING, JobState.RECOVERING})
# A spec that gives nothing but a name: the defaults of a job's demand are JobSpec's own.
DEFAULT_SPEC = JobSpec(name="default")


@dataclass(frozen=True)
class JobDemand:
    """What the objective needs to know about one job.

    ``current`` is the workers the job holds now on usable nodes, ``world_size`` those of its
    running generation (more when a node was lost). ``hit`` says the job pays a transition
    whatever it is given (a fault hit it, or it lost a rank's node); ``recovery`` is the action
    the fault called for. ``slowdown`` is the calibration: observed over modelled iteration time.
    """

    job_id: str
    weight: float
    min_workers: int
    max_workers: int
    current: int = 0
    hit: bool = False
    shape: ModelShape | None = None
    global_batch: int = DEFAULT_SPEC.global_batch
    micro_batch: int = DEFAULT_SPEC.micro_batch
    checkpoint_every: int = DEFAULT_SPEC.checkpoint_every
    world_size: int = 0
    recovery: RecoveryAction | None = None
    resume: bool = False
    slowdown: float = 1.0

    @classmethod
    def of(cls, job_id: str, spec: JobSpec = DEFAULT_SPEC) -> JobDemand:
        """The demand of a job submitted as ``spec``, before it holds or calibrated anything:
        callers ``replace`` what running changes. The one JobSpec → demand mapping."""
        return cls(
            job_id=job_id,
            weight=spec.weight,
            min_workers=spec.min_workers,
            max_workers=spec.max_workers,
            shape=ModelShape.of(spec.model),
            global_batch=spec.global_batch,
            micro_batch=spec.micro_batch,
            checkpoint_every=spec.checkpoint_every,
        )

    @property
    def old_workers(self) -> int:
        """x_old of docs/design.md §4: what the job ran on before this plan."""
        return self.world_size or self.current

    def feasible(self, workers: IntArray) -> npt.NDArray[np.bool_]:
        """Hard constraints: nothing at all, or between min and max workers."""
        within = (workers >= self.min_workers) & (workers <= self.max_workers)
        feasible: npt.NDArray[np.bool_] = (workers == 0) | within
        return feasible


@dataclass(frozen=True)
class Curve:
    """T(t, x) for each worker count, with the parallel configuration behind each value.

    ``flops`` is achieved model FLOP/s (0 where the job cannot run); ``iteration_s`` is the
    predicted step time (inf where nothing fits, nan where the model has no notion of time).
    """

    workers: IntArray
    flops: FloatArray
    iteration_s: FloatArray
    tp: IntArray
    pp: IntArray
    dp: IntArray
    micro_batch: IntArray


@dataclass(frozen=True)
class Transitions:
    """D_trans(t, x_old → x) for each worker count of a curve, split as the executor measures it:
    ``downtime_s`` (failure or start → first step, calibrated by ``factor``) and ``lost_s`` (work
    since the last checkpoint, done again). Kinds and sources index ``KINDS`` and ``SOURCES``."""

    kind: IntArray
    source: IntArray
    downtime_s: FloatArray
    lost_s: FloatArray
    factor: FloatArray

    @property
    def total_s(self) -> FloatArray:
        total: FloatArray = self.downtime_s + self.lost_s
        return total


KINDS: tuple[TransitionKind, ...] = tuple(TransitionKind)
SOURCES: tuple[StateSource, ...] = tuple(StateSource)


class ThroughputModel(Protocol):
    """T(t, x): achieved throughput of a job on each worker count, 0 where it cannot run."""

    def curve(self, demand: JobDemand, workers: IntArray) -> Curve: ...


class TransitionCost(Protocol):
    """D_trans(t, x_old → x) in seconds of lost work for each x; 0 where nothing changes."""

    def transitions(self, demand: JobDemand, old: Curve, new: Curve) -> Transitions: ...

    def calibrated(self, factors: Mapping[TransitionKind, float]) -> TransitionCost:
        """This model with measured/predicted downtime ratios per kind applied."""
        ...


@dataclass(frozen=True)
class Objective:
    """The parameters of G(t, x) (docs/design.md §4) and the allocation granularity.

    ``unit`` is the number of slots the DP hands out at once: a node's GPUs on a GPU cluster,
    1 on the CPU demo. ``run_s`` is D_run, the expected time to the next failure.
    """

    throughput: ThroughputModel
    cost: TransitionCost
    run_s: float
    unit: int = 1


@dataclass(frozen=True)
class Calibration:
    """What the cluster has measured so far, as the models consume it.

    The service learns it (``unicron.services.planner.calibration``); :mod:`.calibration` converts
    it.
    """

    job_slowdown: tuple[tuple[str, float], ...] = ()
    transition_factors: tuple[tuple[TransitionKind, float], ...] = ()
    failure_rate_per_gpu_h: float | None = None


@dataclass(frozen=True)
class NodeView:
    """A usable node (READY, fresh heartbeat) and its free slots; on a GPU node (``gpus`` > 0)
    a slot is a GPU, and no two ranks ever share one."""

    node_id: str
    slots: int
    gpus: int = 0


@dataclass(frozen=True)
class JobView:
    """A non-terminal job as the planner sees it.

    ``ranks`` holds the node of each rank the job still holds on a usable node, in rank order;
    ``failure`` describes the fault that hit the running generation, if any. ``waiting_since``
    is when a PENDING job last became PENDING; ``waited_s`` the waiting its fairness policy
    counts (:mod:`.fairness`: whole aging steps, 0 unless the policy ages).
    """

    demand: JobDemand
    state: JobState
    world_size: int
    generation: int
    ranks: tuple[str, ...] = ()
    failure: str | None = None
    tenant: str | None = None
    waiting_since: float | None = None
    waited_s: float = 0.0

    @property
    def job_id(self) -> str:
        return self.demand.job_id

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


@dataclass(frozen=True)
class OutOfService:
    """A node the plan cannot use, and why (its state: LOST, QUARANTINED, DRAINED)."""

    node_id: str
    slots: int
    why: str


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
    calibration: Calibration = Calibration()
    out_of_service: tuple[OutOfService, ...] = ()

    @property
    def capacity(self) -> int:
        return sum(n.slots for n in self.nodes)
