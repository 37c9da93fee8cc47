"""The planner's fairness policies in the simulator: pure WAF starves a job, aging runs it within
the time its weights predict, the guaranteed minimum runs it at once; the waiting is reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner
from unicron.planning.fairness import PlanRules
from unicron.planning.throughput import MegatronThroughput
from unicron.shared.contracts.plans import Fairness
from unicron.simulator.inputs import ClusterConfig, JobConfig
from unicron.simulator.runner import Result, Scenario, run_policy
from unicron.simulator.workload import Speeds

from bench.simulate import main as bench_main
from tests.simulator.conftest import cluster_file, write
from tests.simulator.test_runs import _app

HOUR = 3600.0
DAYS = 5
AGING_S, STEP_S = 24 * HOUR, 4 * HOUR
# On 32 GPUs the heavy job's second half earns more than the light job on all it can use.
HEAVY = JobConfig("heavy", 6.7, 3.0, 16, 32)
LIGHT = JobConfig("light", 1.3, 1.0, 16, 16)


def run(cluster: ClusterConfig, rules: PlanRules) -> Result:
    scenario = Scenario(cluster, [HEAVY, LIGHT], [], DAYS * 86400.0, HOUR, rules=rules)
    return run_policy(scenario, "unicron")


def aging_bound(cluster: ClusterConfig) -> float:
    """When aging must have started the light job: its weight x (1 + waited / aging) covers
    what its 16 GPUs earn in the heavy job, plus one step for the counting."""

    def flops(job: JobConfig, gpus: int) -> float:
        return Speeds(MegatronThroughput(cluster.spec), job, cluster.gpus, 8).flops(gpus)

    lost = HEAVY.weight * (flops(HEAVY, 32) - flops(HEAVY, 16))
    gained = LIGHT.weight * flops(LIGHT, 16)
    assert lost > gained  # pure WAF starves it
    return AGING_S * (lost / gained - 1) * 1.05 + STEP_S


def test_waf_starves_aging_runs_the_job_within_its_bound_and_the_minimum_at_once(
    cluster: ClusterConfig,
) -> None:
    starved = run(cluster, PlanRules())
    light = starved.summary["jobs"]["light"]
    assert light["first_run_s"] is None and light["wait_s"] == DAYS * 86400.0

    aging = run(cluster, PlanRules(Fairness.AGING, AGING_S, STEP_S))
    first = aging.summary["jobs"]["light"]["first_run_s"]
    assert first is not None and 0 < first <= aging_bound(cluster)
    assert aging.summary["jobs"]["light"]["wait_s"] == first  # once started, it keeps running
    # each weight change is one step of the clock: the plan changes at most once a step
    assert aging.summary["allocation_changes"] <= 2 + DAYS * 86400.0 / STEP_S
    assert aging.summary["accumulated_waf"] < starved.summary["accumulated_waf"]

    guaranteed = run(cluster, PlanRules(Fairness.GUARANTEED_MIN))
    assert guaranteed.summary["jobs"]["light"]["first_run_s"] == 0.0
    assert guaranteed.summary["jobs"]["light"]["wait_s"] == 0.0


def test_cli_reports_each_jobs_waiting(tmp_path: Path) -> None:
    jobs = [
        {"name": "heavy", "params_b": 6.7, "weight": 3, "min_gpus": 16, "max_gpus": 32},
        {"name": "light", "params_b": 1.3, "weight": 1, "min_gpus": 16, "max_gpus": 16},
    ]
    out = tmp_path / "out"
    args = ["--cluster", str(cluster_file(tmp_path)), "--jobs",
            str(write(tmp_path / "jobs.json", json.dumps(jobs))), "--generate", "--rate", "1e-4",
            "--days", "3", "--policy", "unicron", "--fairness", "aging", "--aging-hours", "12",
            "--out", str(out)]  # fmt: skip
    result = CliRunner(env={"COLUMNS": "200"}).invoke(_app(), args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fairness"] == "aging"
    light = summary["policies"]["unicron"]["jobs"]["light"]
    assert 0 < light["wait_s"] < 3 * 86400 and light["first_run_s"] is not None
    assert "waiting per job" in result.output and "waiting (h)" in result.output
    refused = CliRunner().invoke(_app(), [*args[:-2], "--out", str(out), "--fairness", "fair"])
    assert refused.exit_code == 2 and "fair" in refused.output


def test_bench_compares_the_policies_on_the_starvation_scenario(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench_main(["--fairness", "--days", "3", "--seeds", "1", "--aging-hours", "24"])
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    by = {(p["fairness"], p["aging_h"]): p for p in doc["fairness"]}
    waf, aging = by[("waf", None)], by[("aging", 24.0)]
    assert waf["relative_waf"] == 1.0
    never = [job for job, first in waf["first_run_h"].items() if first is None]
    assert never == ["llm-c", "llm-d", "llm-e", "llm-f"]  # the two heaviest take all 128 GPUs
    assert all(waf["wait_h"][job] == 72.0 for job in never)
    assert all(by[("guaranteed_min", None)]["wait_h"][job] == 0.0 for job in never)
    assert aging["relative_waf"] < 1.0 and aging["first_run_h"]["llm-c"] is not None
