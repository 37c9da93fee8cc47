"""Scenarios from the input files, built one way for ``unicron simulate`` and the benchmarks.

:func:`build_scenario` is the whole of ``unicron simulate``'s input handling: cluster, jobs, a
trace (a CSV, or drawn from the paper's mix at a per-GPU rate) and an optional planner
calibration. :func:`load_inputs` and :func:`generated_scenario` split it for callers that draw
many traces over the same cluster and jobs (``bench/simulate.py``).

The planner's failure rate (its ``D_run``) is the calibration file's when it gives one, else
the generating rate for a drawn trace, else the trace's own rate (failures per GPU-hour over
the simulated days, at least one failure).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from unicron.planning.api import Calibration
from unicron.planning.calibration import LLAMA3_FAILURES_PER_GPU_H
from unicron.planning.fairness import PlanRules
from unicron.simulator.inputs import (
    ClusterConfig,
    JobConfig,
    load_calibration,
    load_cluster,
    load_jobs,
)
from unicron.simulator.policies import NAMES
from unicron.simulator.runner import Scenario
from unicron.simulator.trace import Failure, generate_trace, load_trace


@dataclass(frozen=True)
class Inputs:
    """What the files say: the cluster, its jobs and the planner calibration (empty if none)."""

    cluster: ClusterConfig
    jobs: list[JobConfig]
    calibration: Calibration = field(default_factory=Calibration)


@dataclass(frozen=True)
class Options:
    """How to run: the ``unicron simulate`` options that are not about the inputs."""

    sample_minutes: float = 15.0
    measured_plan_time: bool = False
    baseline_allocation: str = "planner"  # or "fifo"
    throughput: tuple[tuple[str, float], ...] = ()  # see Scenario.throughput
    rules: PlanRules = field(default_factory=PlanRules)  # the planner's fairness and quotas


def parse_throughput(items: list[str]) -> tuple[tuple[str, float], ...]:
    """``["oobleck=0.8", …]``: each policy's measured failure-free throughput over the planner's
    model (Megatron's), which replaces the figure its mechanism gives; ValueError says what is
    wrong with an item."""
    parsed: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in NAMES:
            raise ValueError(f"--baseline-throughput {item!r}: expected POLICY=FACTOR, POLICY one "
                             f"of {', '.join(NAMES)}")  # fmt: skip
        try:
            factor = float(value)
        except ValueError:
            factor = -1.0
        if not 0 < factor <= 2:
            raise ValueError(f"--baseline-throughput {item!r}: FACTOR must be a number in (0, 2]")
        parsed[name] = factor
    return tuple(sorted(parsed.items()))


def load_inputs(cluster: Path, jobs: Path, calibration: Path | None = None) -> Inputs:
    """The cluster, jobs and calibration files; raises
    :class:`~unicron.simulator.inputs.InputError`."""
    config = load_cluster(cluster)
    job_list = load_jobs(jobs, config)
    calib = load_calibration(calibration) if calibration else Calibration()
    return Inputs(config, job_list, calib)


def make_scenario(
    inputs: Inputs,
    failures: list[Failure],
    days: float,
    generated_rate: float | None = None,
    options: Options | None = None,
) -> Scenario:
    """A scenario over ``failures``; ``generated_rate`` is the rate they were drawn at (None for
    a trace read from a file)."""
    opts = options or Options()
    calibration = inputs.calibration
    if calibration.failure_rate_per_gpu_h is None:  # D_run from the trace itself
        hours = days * 24 * inputs.cluster.gpus
        rate = generated_rate if generated_rate is not None else max(len(failures), 1) / hours
        calibration = replace(calibration, failure_rate_per_gpu_h=rate)
    return Scenario(
        inputs.cluster,
        inputs.jobs,
        failures,
        days * 86400.0,
        opts.sample_minutes * 60.0,
        calibration,
        opts.measured_plan_time,
        opts.baseline_allocation,
        opts.throughput,
        opts.rules,
    )


def generated_scenario(
    inputs: Inputs,
    rate: float,
    days: float,
    seed: int,
    repair_hours: float = 4.0,
    options: Options | None = None,
) -> Scenario:
    """A scenario over a trace drawn from the paper's mix at ``rate`` failures per GPU-hour."""
    config = inputs.cluster
    failures = generate_trace(config.nodes, config.gpus_per_node, rate, days, seed, repair_hours)
    return make_scenario(inputs, failures, days, rate, options)


def build_scenario(
    cluster: Path,
    jobs: Path,
    days: float,
    trace: Path | None = None,
    rate: float = LLAMA3_FAILURES_PER_GPU_H,
    seed: int = 0,
    repair_hours: float = 4.0,
    calibration: Path | None = None,
    options: Options | None = None,
) -> Scenario:
    """``unicron simulate``'s scenario: the trace read from ``trace``, or drawn at ``rate`` when
    it is None. Files are read in the CLI's order (cluster, jobs, trace, calibration), so the
    first bad one is the one reported; raises :class:`~unicron.simulator.inputs.InputError`."""
    config = load_cluster(cluster)
    job_list = load_jobs(jobs, config)
    failures = (
        load_trace(trace, config.nodes)
        if trace
        else generate_trace(config.nodes, config.gpus_per_node, rate, days, seed, repair_hours)
    )
    calib = load_calibration(calibration) if calibration else Calibration()
    inputs = Inputs(config, job_list, calib)
    return make_scenario(inputs, failures, days, None if trace else rate, options)
