"""Whole runs: determinism, no over-allocation, completions, trace generation, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner
from unicron.cli.simulate import simulate
from unicron.planning.api import Calibration, TransitionKind
from unicron.planning.clusters import CPU
from unicron.shared.contracts.taxonomy import Severity
from unicron.simulator.calibrate import simulated_crash_downtime
from unicron.simulator.cluster import ClusterState, OverAllocation
from unicron.simulator.inputs import ClusterConfig, JobConfig
from unicron.simulator.policies import NAMES
from unicron.simulator.policies.oobleck import OVERHEAD as OOBLECK_OVERHEAD
from unicron.simulator.policies.unicron import DEBOUNCE_S, EXIT_S
from unicron.simulator.runner import Scenario, run_all, run_policy
from unicron.simulator.trace import PAPER_MIX, Failure, generate_trace

from tests.simulator.conftest import cluster_file, write

DAY = 86400.0


def dense(cluster: ClusterConfig, seed: int) -> list[Failure]:
    return generate_trace(cluster.nodes, cluster.gpus_per_node, 2e-2, 3, seed, repair_h=2)


def scenario(cluster: ClusterConfig, jobs: list[JobConfig], seed: int = 3) -> Scenario:
    return Scenario(
        cluster,
        jobs,
        dense(cluster, seed),
        3 * DAY,
        1800.0,
        Calibration(failure_rate_per_gpu_h=2e-2),
    )


def _strip(summary: dict[str, Any]) -> dict[str, Any]:
    policies = {
        n: {k: v for k, v in p.items() if not k.startswith("plan_ms")}
        for n, p in summary["policies"].items()
    }
    return {**summary, "policies": policies, "wall_s": None}


def test_same_seed_same_result(cluster: ClusterConfig, two_jobs: list[JobConfig]) -> None:
    first, _ = run_all(scenario(cluster, two_jobs), NAMES)
    again, _ = run_all(scenario(cluster, two_jobs), NAMES)
    other, _ = run_all(scenario(cluster, two_jobs, seed=4), NAMES)
    assert _strip(first) == _strip(again)
    assert _strip(first) != _strip(other)


@pytest.mark.parametrize("name", NAMES)
def test_gpus_never_over_allocated(cluster: ClusterConfig, name: str) -> None:
    jobs = [
        JobConfig("a", 6.7, 2.0, 16, 32),
        JobConfig("b", 1.3, 1.0, 8, 16),
        JobConfig("c", 2.7, 1.5, 8, 16, arrival_s=DAY / 2, length_s=DAY / 4),
    ]
    result = run_policy(scenario(cluster, jobs), name)  # the runner checks after every event
    for gpus in result.timeline.gpus:
        assert sum(gpus) <= cluster.gpus
    assert result.summary["failures"] > 10


def test_ledger_refuses_over_allocation() -> None:
    state = ClusterState(2, 8)
    state.assign("a", [0] * 6)
    with pytest.raises(OverAllocation):
        state.grant("b", 0, 3)
    state.fail(1, back_at=100.0)
    with pytest.raises(OverAllocation):
        state.assign_nodes("b", [1])
    assert not state.repair(1, now=50.0) and state.repair(1, now=100.0)


def test_job_with_a_length_finishes_and_frees_its_gpus(cluster: ClusterConfig) -> None:
    jobs = [
        JobConfig("short", 1.3, 1.0, 8, 16, length_s=3600.0),
        JobConfig("long", 1.3, 1.0, 8, 32),
    ]
    result = run_policy(Scenario(cluster, jobs, [], 4 * 3600.0, 600.0), "unicron")
    assert result.summary["finished"] == ["short"]
    assert result.timeline.gpus[-1] == [0, 32]


def test_generated_trace_follows_the_paper_mix() -> None:
    trace = generate_trace(16, 8, 2e-3, 60, seed=1)
    expected = 2e-3 * 128 * 60 * 24
    assert abs(len(trace) - expected) < 4 * expected**0.5
    sev1 = [f for f in trace if f.severity == Severity.SEV1]
    share = sum(
        v for c, v in PAPER_MIX.items() if c.value in {"ecc", "nvlink", "invalid_dma", "gpu_driver"}
    )
    assert abs(len(sev1) / len(trace) - share / sum(PAPER_MIX.values())) < 0.06
    assert all(f.repair_s >= 1800 for f in sev1)
    assert all(f.repair_s == 0 for f in trace if f.severity != Severity.SEV1)
    assert generate_trace(16, 8, 2e-3, 60, seed=1) == trace


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(simulate)
    return app


def test_cli_writes_summary_timelines_and_plots(tmp_path: Path) -> None:
    jobs = write(
        tmp_path / "jobs.json",
        json.dumps(
            [
                {"name": "a", "params_b": 1.3, "weight": 1, "min_gpus": 8, "max_gpus": 16},
                {"name": "b", "params_b": 2.7, "weight": 2, "min_gpus": 8, "max_gpus": 16},
            ]
        ),
    )
    out = tmp_path / "out"
    args = [
        "--cluster",
        str(cluster_file(tmp_path)),
        "--jobs",
        str(jobs),
        "--generate",
        "--rate",
        "5e-3",
        "--days",
        "2",
        "--seed",
        "1",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]) == set(NAMES)
    for fields in summary["policies"].values():
        assert {"accumulated_waf", "ettr", "failures", "downtime_s"} <= set(fields)
    assert summary["ratio_unicron_to_best_baseline"] > 0
    for name in ("waf.png", "gpus.png", "trace.csv", "timeline-unicron.csv"):
        assert (out / name).stat().st_size > 0


def test_cli_rejects_a_bad_trace_naming_the_line(tmp_path: Path) -> None:
    jobs = write(
        tmp_path / "jobs.json",
        '[{"name": "a", "params_b": 1.3, "weight": 1, "min_gpus": 8, "max_gpus": 8}]',
    )
    trace = write(tmp_path / "t.csv", "time_s,node,category,repair_s\n5,0,ecc,60\n9,0,ecc,-1\n")
    args = [
        "--cluster",
        str(cluster_file(tmp_path)),
        "--jobs",
        str(jobs),
        "--trace",
        str(trace),
        "--out",
        str(tmp_path / "o"),
    ]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 2
    assert "t.csv:3: repair_s" in result.output


def test_cpu_crash_downtime_uses_the_planners_calibrated_cost() -> None:
    plain = simulated_crash_downtime()
    # the exit seen + the planner's debounce + a warm spare taking the seat + re-forming the
    # group + a peer's tiny state: far below a fresh process's 1.7 s
    assert CPU.spare_s is not None
    modelled = EXIT_S + DEBOUNCE_S + CPU.spare_s + CPU.reform_s
    assert modelled <= plain < modelled + 0.05 < CPU.launch_s
    doubled = Calibration(
        transition_factors=((TransitionKind.RESTART, 2.0),), failure_rate_per_gpu_h=1e-3
    )
    restart = plain - EXIT_S - DEBOUNCE_S
    assert simulated_crash_downtime(doubled) == pytest.approx(plain + restart)


def test_a_measured_baseline_throughput_replaces_its_mechanisms_figure(
    cluster: ClusterConfig, two_jobs: list[JobConfig]
) -> None:
    quiet = Scenario(cluster, two_jobs, [], DAY, 3600.0, Calibration(failure_rate_per_gpu_h=1e-4))
    modelled = run_policy(quiet, "oobleck").summary
    measured = run_policy(replace(quiet, throughput=(("oobleck", 0.5),)), "oobleck").summary
    ratio = measured["accumulated_waf"] / modelled["accumulated_waf"]
    assert ratio == pytest.approx(0.5 / OOBLECK_OVERHEAD)
    assert measured["measured_throughput"] == 0.5 and "measured_throughput" not in modelled


@pytest.mark.parametrize(
    ("item", "says"),
    [("oobleck", "expected POLICY=FACTOR"), ("hal=0.5", "POLICY one of"), ("bamboo=x", "(0, 2]")],
)
def test_cli_refuses_a_bad_baseline_throughput(tmp_path: Path, item: str, says: str) -> None:
    jobs = write(
        tmp_path / "jobs.json",
        '[{"name": "a", "params_b": 1.3, "weight": 1, "min_gpus": 8, "max_gpus": 8}]',
    )
    args = ["--cluster", str(cluster_file(tmp_path)), "--jobs", str(jobs), "--generate",
            "--out", str(tmp_path / "o"), "--baseline-throughput", item]  # fmt: skip
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 2
    assert says in result.output
