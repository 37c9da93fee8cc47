"""The event loop: one policy over one trace, then every policy over the same trace.

Events: job arrivals (from the jobs file), failures (from the trace), repairs (scheduled by the
policies when they take a node out), job completions (re-armed as rates change), policy
wake-ups, and a timeline sample every ``sample_s``. Before each event every job accrues its
work up to the event's time; after each, the cluster ledger is checked (no GPU over-allocated,
none on a node out of service).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from unicron.planning.api import Calibration
from unicron.planning.fairness import PlanRules
from unicron.simulator.events import Kind
from unicron.simulator.inputs import ClusterConfig, JobConfig
from unicron.simulator.metrics import Timeline, policy_summary, ratio
from unicron.simulator.policies import make_policy
from unicron.simulator.policies.base import Policy
from unicron.simulator.state import Simulation
from unicron.simulator.trace import Failure

Progress = Callable[[str, float], None]  # (policy, simulated seconds done)


@dataclass(frozen=True)
class Scenario:
    cluster: ClusterConfig
    jobs: list[JobConfig]
    trace: list[Failure]
    duration_s: float
    sample_s: float = 900.0
    calibration: Calibration = field(default_factory=Calibration)
    measured_plan_time: bool = False
    baseline_allocation: str = "planner"  # or "fifo": see unicron.simulator.policies.base
    # (policy, measured failure-free throughput / the planner's model), overriding the mechanism
    throughput: tuple[tuple[str, float], ...] = ()
    # The planner's fairness policy and quotas (unicron's plans, and the baselines' first one).
    rules: PlanRules = field(default_factory=PlanRules)


@dataclass
class Result:
    policy: str
    summary: dict[str, Any]
    timeline: Timeline
    wall_s: float


def run_policy(scenario: Scenario, name: str, progress: Progress | None = None) -> Result:
    started = time.perf_counter()
    policy = make_policy(
        name,
        scenario.calibration,
        scenario.measured_plan_time,
        scenario.baseline_allocation,
        scenario.rules,
    )
    policy.measured_throughput = dict(scenario.throughput).get(name)
    sim = Simulation(scenario.cluster, scenario.jobs, policy)
    timeline = Timeline(name, [j.name for j in scenario.jobs])
    _seed_events(sim, policy, scenario)
    failures = 0
    while len(sim.queue):
        event = sim.queue.pop()
        if event.time_s > scenario.duration_s:
            break
        sim.advance(event.time_s)
        failures += _dispatch(sim, policy, event.kind, event.payload, timeline)
        sim.cluster.check()
        if progress and event.kind == Kind.SAMPLE:
            progress(name, sim.now)
    sim.advance(scenario.duration_s)
    timeline.sample(sim)
    summary = policy_summary(sim, failures, policy.stats())
    if policy.measured_throughput is not None:
        summary["measured_throughput"] = policy.measured_throughput
    return Result(name, summary, timeline, time.perf_counter() - started)


def _seed_events(sim: Simulation, policy: Policy, scenario: Scenario) -> None:
    for job in scenario.jobs:
        if job.arrival_s > 0:
            sim.queue.push(job.arrival_s, Kind.ARRIVAL, job.name)
    for failure in scenario.trace:
        sim.queue.push(failure.time_s, Kind.FAILURE, failure)
    t = 0.0
    while t < scenario.duration_s:
        sim.queue.push(t, Kind.SAMPLE)
        t += scenario.sample_s
    first = [r for r in sim.jobs.values() if r.config.arrival_s <= 0]
    for run in first:
        run.arrived = True
    policy.start(sim, first)


def _dispatch(sim: Simulation, policy: Policy, kind: Kind, payload: Any, timeline: Timeline) -> int:
    """Handle one event; 1 for a failure (counted), else 0."""
    if kind == Kind.FAILURE:
        policy.on_failure(sim, payload)
        return 1
    if kind == Kind.REPAIR:
        policy.on_repair(sim, payload)
    elif kind == Kind.ARRIVAL:
        run = sim.jobs[payload]
        run.arrived, run.last_t = True, sim.now
        policy.on_arrival(sim, run)
    elif kind == Kind.FINISH:
        name, version = payload
        run = sim.jobs[name]
        if run.version == version and not run.done:
            sim.finish(run)
            policy.on_finish(sim, run)
    elif kind == Kind.WAKE:
        policy.on_wake(sim, payload)
    elif kind == Kind.SAMPLE:
        timeline.sample(sim)
    return 0


def run_all(
    scenario: Scenario, names: Sequence[str], progress: Progress | None = None
) -> tuple[dict[str, Any], list[Result]]:
    """Every policy over the same scenario: the summary document and the per-policy results."""
    results = [run_policy(scenario, name, progress) for name in names]
    policies = {r.policy: r.summary for r in results}
    summary = {
        "policies": policies,
        "ratio_unicron_to_best_baseline": ratio(policies),
        "duration_s": scenario.duration_s,
        "gpus": scenario.cluster.gpus,
        "baseline_allocation": scenario.baseline_allocation,
        "fairness": scenario.rules.fairness.value,
        "wall_s": {r.policy: round(r.wall_s, 3) for r in results},
    }
    return summary, results
