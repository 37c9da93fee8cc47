"""``unicron``: our detector latencies, the planner itself, and its transition-cost model.

Detection (measured by ``bench/detect.py``, docs/design.md §3; we charge about each p99): a process
that dies is seen by its agent's supervision (``EXIT_S`` = 0.08 s; crash p99 0.078 s); an
exception is reported in-band before the process exits (``EXCEPTION_S`` = 0.2 s; p99 0.162 s);
a hang is a step slower than 3x the running mean, seen after 3 x iteration + 0.5 s; a lost node
after its 3 missed 1-s heartbeats (``NODE_S`` = 3 s).

Recovery, per the taxonomy: a SEV3 fault is reattempted in place and a SEV2 fault restarts the
job's processes on the same nodes: the planner's debounce (``DEBOUNCE_S``, 0.1 s), then the
in-place transition as the planner's :class:`~unicron.planning.costs.ModelledDowntime` prices it
(reattempt: the preset's ``reattempt_s``; restart: a warm spare's takeover, or a fresh launch
where the preset has no spare time, + re-form + the state from a live data-parallel peer, or
from disk with the steps since the checkpoint redone when there is none). A SEV1 fault isolates
the node and re-plans the whole cluster with :func:`unicron.planning.planning.plan_cluster`, as
do repairs, arrivals and completions: every job whose allocation changes pays the planned
transition's downtime and lost work (the plan's own explanation) plus the planning time. D_run
comes from the trace's failure rate; transition factors from the same
:class:`~unicron.planning.api.Calibration` the planner is fed.

Fairness: the planner's rules (:class:`~unicron.planning.fairness.PlanRules`) apply as in the
service. Under ``aging`` the policy wakes at every aging step of the clock, records each job's
waiting so far (what the service reads from the job's history) and re-plans if any job waited.

Planning time: by default a fixed ``plan_s`` (the planner's 0.1-s debounce plus a 1-s
allowance), so a seed always gives the same result; the measured time of every planner call
is reported in the summary, and ``measured=True`` charges it instead.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from unicron.planning.api import (
    Calibration,
    ClusterInputs,
    JobDemand,
    JobView,
    NodeView,
    Objective,
)
from unicron.planning.costs import ModelledDowntime
from unicron.planning.fairness import PlanRules
from unicron.planning.planning import PlanDraft, calibrated, plan_cluster
from unicron.planning.throughput import MegatronThroughput
from unicron.shared.contracts.models import JobState
from unicron.shared.contracts.plans import Fairness
from unicron.shared.contracts.taxonomy import RecoveryAction, Severity, severity_of
from unicron.simulator.events import Kind
from unicron.simulator.policies.base import Policy, detection_class
from unicron.simulator.state import JobRun, Simulation
from unicron.simulator.trace import Failure, node_name
from unicron.simulator.workload import demand_of

EXIT_S = 0.08
EXCEPTION_S = 0.2
NODE_S = 3.0
DEBOUNCE_S = 0.1
HANG_MEAN_FACTOR = 3.0
HANG_SLACK_S = 0.5
PLAN_S = 0.1 + 1.0
AGING = "aging step"  # the payload of the policy's wake-ups at each aging step


def _index(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


class Unicron(Policy):
    name = "unicron"

    def __init__(
        self,
        calibration: Calibration,
        plan_s: float = PLAN_S,
        measured: bool = False,
        rules: PlanRules | None = None,
    ) -> None:
        self.calibration, self.plan_s, self.measured = calibration, plan_s, measured
        self.rules = rules or PlanRules()
        self.plan_ms: list[float] = []
        self.objective: Objective | None = None
        self.hits = 0
        self.changes = 0  # a job's allocation changed by a plan (starts and stops included)

    def detect_s(self, failure: Failure, run: JobRun) -> float:
        kind = detection_class(failure.category)
        if kind == "hang":
            return HANG_MEAN_FACTOR * run.speeds.iteration_s(run.workers) + HANG_SLACK_S
        return {"node": NODE_S, "exit": EXIT_S}.get(kind, EXCEPTION_S)

    def _objective(self, sim: Simulation) -> Objective:
        if self.objective is None:
            spec = sim.config.spec
            base = Objective(
                MegatronThroughput(spec), ModelledDowntime(spec), 86400.0, spec.unit_slots
            )
            inputs = ClusterInputs((NodeView("n", sim.config.gpus),), (), (), self.calibration)
            self.objective = calibrated(base, inputs)
        return self.objective

    # Events -----------------------------------------------------------------------------------

    def start(self, sim: Simulation, runs: list[JobRun]) -> None:
        for run in runs:
            run.memo["since"] = sim.now
        self.replan(sim, {})
        if self.rules.fairness == Fairness.AGING:
            sim.wake(self.rules.boundary(sim.now) + self.rules.aging_step_s, AGING)

    def on_arrival(self, sim: Simulation, run: JobRun) -> None:
        run.memo["since"] = sim.now
        self.replan(sim, {})

    def on_wake(self, sim: Simulation, payload: object) -> None:
        """An aging step: count each job's waiting so far; re-plan if any job waited."""
        if payload != AGING:
            return
        runs = sim.active()
        aged = [r for r in runs if r.memo.get("waited", 0.0) != r.wait_s]
        for run in aged:
            run.memo["waited"] = run.wait_s
        if aged:
            self.replan(sim, {})
        sim.wake(sim.now + self.rules.aging_step_s, AGING)

    def on_finish(self, sim: Simulation, run: JobRun) -> None:
        run.memo["ranks"], run.memo["world"] = [], 0
        self.replan(sim, {})

    def on_repair(self, sim: Simulation, node: int) -> None:
        if sim.cluster.repair(node, sim.now):
            self.replan(sim, {})

    def on_failure(self, sim: Simulation, failure: Failure) -> None:
        severity, action = severity_of(failure.category)
        hit = [sim.jobs[n] for n in sim.cluster.holders(failure.node)]
        self.hits += len(hit)
        for run in hit:
            run.hits += 1
        if severity != Severity.SEV1:
            for run in hit:
                in_place = DEBOUNCE_S + self.in_place_s(sim, run, action)
                sim.hold(run, self.detect_s(failure, run) + in_place)
            return
        sim.cluster.fail(failure.node, sim.now + failure.repair_s)
        sim.queue.push(sim.now + failure.repair_s, Kind.REPAIR, failure.node)
        self.replan(sim, {run.name: self.detect_s(failure, run) for run in hit})

    # Transitions ------------------------------------------------------------------------------

    def in_place_s(self, sim: Simulation, run: JobRun, recovery: RecoveryAction) -> float:
        """Downtime + lost work of reattempting or restarting in place, as the planner prices it."""
        objective = self._objective(sim)
        w = run.workers
        demand = replace(self.demand(run), current=w, world_size=w, hit=True, recovery=recovery)
        x = np.array([w], dtype=np.int64)
        curve = objective.throughput.curve(demand, x)
        moves = objective.cost.transitions(demand, curve, curve)
        return float(moves.downtime_s[0] + moves.lost_s[0])

    def demand(self, run: JobRun) -> JobDemand:
        return demand_of(run.config, run.speeds.iteration_s(run.memo.get("world", 0)))

    def view(self, sim: Simulation, run: JobRun, hit: bool) -> JobView:
        world = run.memo.get("world", 0)
        base = self.demand(run)
        waited = run.memo.get("waited", 0.0)
        if world == 0:
            demand = replace(base, resume=bool(run.memo.get("ran")))
            gen, since = run.memo.get("gen", 0), run.memo.get("since")
            return JobView(demand, JobState.PENDING, 0, gen, waiting_since=since, waited_s=waited)
        ranks = tuple(n for n in run.memo["ranks"] if sim.cluster.up[_index(n)])
        lost = len(ranks) < world
        recovery = RecoveryAction.RECONFIGURE if hit or lost else None
        demand = replace(
            base, current=len(ranks), world_size=world, hit=hit or lost, recovery=recovery
        )
        failure = "node fault" if hit or lost else None
        gen = run.memo.get("gen", 0)
        return JobView(demand, JobState.RUNNING, world, gen, ranks, failure, waited_s=waited)

    def replan(self, sim: Simulation, detect: dict[str, float]) -> None:
        runs = sim.active()
        nodes = tuple(
            NodeView(node_name(n), sim.config.gpus_per_node)
            for n in range(sim.config.nodes)
            if sim.cluster.up[n]
        )
        views = tuple(self.view(sim, r, r.name in detect) for r in runs)
        draft = plan_cluster(
            ClusterInputs(nodes, views, (), self.calibration), self._objective(sim), self.rules
        )
        self.plan_ms.append(draft.planning_ms)
        self.apply(sim, runs, draft, detect)

    def apply(
        self, sim: Simulation, runs: list[JobRun], draft: PlanDraft, detect: dict[str, float]
    ) -> None:
        plan_s = draft.planning_ms / 1e3 if self.measured else self.plan_s
        for run in runs:
            sim.cluster.release(run.name)
        for run, a in zip(runs, draft.allocations, strict=True):
            sim.cluster.assign(run.name, [_index(n) for n in a.nodes])
        for run, a in zip(runs, draft.allocations, strict=True):
            why = a.explanation
            # A first launch is free for every policy alike: only changes are charged.
            moved = why is not None and why.transition not in ("none", "start")
            cost = why.predicted_downtime_s + why.predicted_lost_work_s if why and moved else 0.0
            if moved or run.name in detect:
                sim.hold(run, detect.get(run.name, 0.0) + plan_s + cost)
            if a.workers != run.memo.get("world", 0) or list(a.nodes) != run.memo.get("ranks"):
                run.memo["gen"] = run.memo.get("gen", 0) + 1
                self.changes += 1
            if a.workers == 0 and run.memo.get("world", 0):  # preempted: it waits from now
                run.memo["since"] = sim.now
            run.memo["world"], run.memo["ranks"] = a.workers, list(a.nodes)
            run.memo["ran"] = run.memo.get("ran", False) or a.workers > 0
            sim.set_workers(run, a.workers)

    def stats(self) -> dict[str, float]:
        ms = np.array(self.plan_ms or [0.0])
        return {
            "job_hits": float(self.hits),
            "plans": float(len(self.plan_ms)),
            "allocation_changes": float(self.changes),
            "plan_ms_p50": float(np.percentile(ms, 50)),
            "plan_ms_max": float(ms.max()),
        }
