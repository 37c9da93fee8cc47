"""What every policy is, and the machinery the baselines share.

A :class:`Policy` gives each job its throughput model and overhead factor, and reacts to the
simulation's events: jobs arriving and finishing, failures from the trace, nodes repaired.

The baselines (:class:`NodeOwnerPolicy`) are per-job systems with no cluster-wide planner. By
default (``allocation="planner"``), to isolate what failure handling is worth, they start from
the *same* allocation Unicron's planner gives the failure-free cluster (node counts and
placement from :func:`unicron.planning.planning.plan_cluster`) — generous to them; with
``allocation="fifo"`` each job gets up to its maximum, in submission order, from the free
nodes, as a batch scheduler grants requests. A job that arrives later takes free nodes
first-come first-served. Each job then owns its nodes: a node it loses comes back to it when
repaired (if the policy can grow, or the job is stalled without nodes), and no job ever takes
another's nodes.

Detection classes (how a fault is first seen): *hang* — a collective that never completes
(task hang, NCCL timeout); *node* — a machine that stops answering; *exit* — a process that
dies without a word (killed, segfault: ``exited_abnormally``); *exception* — every other
category, which raises in the training process and makes it exit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from unicron.planning.api import ClusterInputs, JobView, NodeView, Objective
from unicron.planning.costs import ModelledDowntime
from unicron.planning.fairness import PlanRules
from unicron.planning.planning import plan_cluster
from unicron.planning.throughput import MegatronThroughput
from unicron.shared.contracts.models import JobState
from unicron.shared.contracts.taxonomy import FailureCategory, Severity
from unicron.simulator.events import Kind
from unicron.simulator.inputs import ClusterConfig, JobConfig
from unicron.simulator.trace import Failure, node_name
from unicron.simulator.workload import Speeds, demand_of, shape_for

if TYPE_CHECKING:
    from unicron.simulator.state import JobRun, Simulation

HANGS = frozenset({FailureCategory.TASK_HANG, FailureCategory.NCCL_TIMEOUT})
NODE_LOSS = frozenset({FailureCategory.NODE_DOWN})


def detection_class(category: FailureCategory) -> str:
    if category in HANGS:
        return "hang"
    if category in NODE_LOSS:
        return "node"
    return "exit" if category is FailureCategory.EXITED_ABNORMALLY else "exception"


class Policy(ABC):
    """A recovery policy under simulation."""

    name: ClassVar[str]
    # The user's measured failure-free throughput relative to the planner's model, which then
    # replaces the mechanism's own figure (``unicron simulate --baseline-throughput``).
    measured_throughput: float | None = None

    def speeds(self, job: JobConfig, config: ClusterConfig) -> Speeds:
        """T(x) of the job under this policy (default: the planner's Megatron model)."""
        return Speeds(MegatronThroughput(config.spec), job, config.gpus, config.gpus_per_node)

    def overhead(self, run: JobRun, workers: int) -> float:
        """Failure-free throughput factor of the policy's mechanism (1: none)."""
        return 1.0

    def throughput_factor(self, run: JobRun, workers: int) -> float:
        """What multiplies T(x): the measured figure where one was given, else the mechanism's."""
        if self.measured_throughput is not None:
            return self.measured_throughput
        return self.overhead(run, workers)

    @abstractmethod
    def start(self, sim: Simulation, runs: list[JobRun]) -> None:
        """Allocate the jobs submitted at time 0."""

    @abstractmethod
    def on_arrival(self, sim: Simulation, run: JobRun) -> None: ...

    @abstractmethod
    def on_failure(self, sim: Simulation, failure: Failure) -> None: ...

    @abstractmethod
    def on_repair(self, sim: Simulation, node: int) -> None: ...

    def on_finish(self, sim: Simulation, run: JobRun) -> None:  # noqa: B027 — optional hook
        """A job finished and released its nodes (baselines leave them free)."""

    def on_wake(self, sim: Simulation, payload: Any) -> None:  # noqa: B027 — optional hook
        """A callback the policy asked for with :meth:`Simulation.wake`."""

    def stats(self) -> dict[str, float]:
        """Policy-specific figures for the summary."""
        return {}


def shard_bytes(config: ClusterConfig, run: JobRun, workers: int) -> float:
    """Training state one rank holds: model state / (TP · PP), as the planner's cost model."""
    tp, pp, _, _ = run.speeds.config(workers)
    shape, _, _ = shape_for(run.config.params_b)
    return config.spec.state_bytes * shape.params / max(tp * pp, 1)


def failure_free_plan(
    config: ClusterConfig, jobs: list[JobConfig], rules: PlanRules
) -> dict[str, list[int]]:
    """Node of each rank per job in the planner's plan for the failure-free cluster."""
    spec = config.spec
    objective = Objective(
        MegatronThroughput(spec), ModelledDowntime(spec), 30 * 86400.0, spec.unit_slots
    )
    nodes = tuple(NodeView(node_name(n), config.gpus_per_node) for n in range(config.nodes))
    views = tuple(JobView(demand_of(j), JobState.PENDING, 0, 0) for j in jobs)
    draft = plan_cluster(ClusterInputs(nodes, views), objective, rules)
    return {a.job_id: [int(n.rsplit("-", 1)[1]) for n in a.nodes] for a in draft.allocations}


class NodeOwnerPolicy(Policy):
    """A baseline: jobs own whole nodes; failures shrink them, repairs may grow them back."""

    regrows: ClassVar[bool] = True  # a repaired node rejoins its job (elastic systems)
    takes_spares: ClassVar[bool] = True  # a job that lost a node takes a free one

    def __init__(self, allocation: str = "planner", rules: PlanRules | None = None) -> None:
        self.hits = 0
        self.allocation = allocation
        self.rules = rules or PlanRules()

    def start(self, sim: Simulation, runs: list[JobRun]) -> None:
        if self.allocation == "fifo":
            for run in runs:
                self.on_arrival(sim, run)
            return
        plan = failure_free_plan(sim.config, [r.config for r in runs], self.rules)
        for run in runs:
            nodes = sorted(set(plan.get(run.name, [])))
            run.memo["home"] = set(nodes)
            run.memo["target"] = len(nodes)
            self.place(sim, run, nodes)

    def on_arrival(self, sim: Simulation, run: JobRun) -> None:
        per = sim.config.gpus_per_node
        free = sim.cluster.free_nodes()[: run.config.max_gpus // per]
        if len(free) * per < run.config.min_gpus:
            free = []
        run.memo["home"], run.memo["target"] = set(free), len(free)
        self.place(sim, run, free)

    def place(self, sim: Simulation, run: JobRun, nodes: list[int]) -> None:
        sim.cluster.assign_nodes(run.name, nodes)
        sim.set_workers(run, run.speeds.best_fit(len(nodes) * sim.config.gpus_per_node))

    def on_failure(self, sim: Simulation, failure: Failure) -> None:
        sev1 = failure.severity == Severity.SEV1
        remove = sev1 or self.removes_node(failure)
        hit = sim.cluster.holders(failure.node)
        if remove:
            back = failure.repair_s if sev1 else self.rejoin_s(sim)
            sim.cluster.fail(failure.node, sim.now + back)
            sim.queue.push(sim.now + back, Kind.REPAIR, failure.node)
        for name in hit:
            run = sim.jobs[name]
            run.hits += 1
            self.hits += 1
            if remove and self.takes_spares:
                self.refill(sim, run)
            held = sim.cluster.gpus_of(name)
            sim.set_workers(run, run.speeds.best_fit(held))
            sim.hold(run, self.detect_s(failure, run) + self.recover_s(sim, run, failure, remove))

    def refill(self, sim: Simulation, run: JobRun) -> None:
        """Take free nodes until the job is back to the size it was given."""
        mine = sim.cluster.nodes_of(run.name)
        spare = sim.cluster.free_nodes()[: max(run.memo["target"] - len(mine), 0)]
        if spare:
            run.memo["home"] |= set(spare)
            sim.cluster.assign_nodes(run.name, mine + spare)

    def on_repair(self, sim: Simulation, node: int) -> None:
        if not sim.cluster.repair(node, sim.now):
            return
        for run in sim.active():
            mine = sim.cluster.nodes_of(run.name)
            grows = self.regrows or run.workers == 0  # a stalled job takes it back anyway
            if grows and node in run.memo.get("home", ()) and len(mine) < run.memo["target"]:
                sim.cluster.assign_nodes(run.name, [*mine, node])
                before = run.workers
                sim.set_workers(run, run.speeds.best_fit(sim.cluster.gpus_of(run.name)))
                if run.workers != before:
                    sim.hold(run, self.grow_s(sim, run))
                return

    def removes_node(self, failure: Failure) -> bool:
        """Whether a fault that leaves the node healthy still takes it out (default: no)."""
        return False

    def rejoin_s(self, sim: Simulation) -> float:
        """How soon a node taken out by a non-SEV1 fault is back (its processes relaunched)."""
        return sim.config.spec.launch_s

    @abstractmethod
    def detect_s(self, failure: Failure, run: JobRun) -> float: ...

    @abstractmethod
    def recover_s(self, sim: Simulation, run: JobRun, failure: Failure, removed: bool) -> float:
        """Seconds from detection to training again, recomputation included."""

    @abstractmethod
    def grow_s(self, sim: Simulation, run: JobRun) -> float:
        """Downtime of taking a repaired node back."""

    def stats(self) -> dict[str, float]:
        return {"job_hits": float(self.hits)}


def half_interval(run: JobRun) -> float:
    """Expected recomputation after a checkpoint restart: half a checkpoint interval."""
    return run.config.checkpoint_interval_s / 2
