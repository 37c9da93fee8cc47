"""Each policy's behaviour on small hand-made traces."""

from __future__ import annotations

from pathlib import Path

import pytest
from unicron.planning.api import Calibration
from unicron.planning.clusters import A100
from unicron.simulator.inputs import ClusterConfig, JobConfig
from unicron.simulator.policies.oobleck import RECONFIGURE_S
from unicron.simulator.policies.restart import DRAIN_S, RESUBMIT_S, SETUP_S, TIMEOUT_S
from unicron.simulator.policies.unicron import DEBOUNCE_S, EXCEPTION_S
from unicron.simulator.runner import Result, Scenario, run_policy

from tests.simulator.conftest import trace_of

HOUR = 3600.0
CALIB = Calibration(failure_rate_per_gpu_h=1e-4)


def run(
    cluster: ClusterConfig,
    jobs: list[JobConfig],
    rows: str,
    tmp: Path,
    name: str,
    hours: float = 3.0,
) -> Result:
    scenario = Scenario(cluster, jobs, trace_of(tmp, rows), hours * HOUR, 60.0, CALIB)
    return run_policy(scenario, name)


def gpus_at(result: Result, t: float) -> list[int]:
    i = max(k for k, s in enumerate(result.timeline.time_s) if s <= t)
    return result.timeline.gpus[i]


SEV3 = "3600,0,link_flapping,0\n"


def test_sev3_unicron_reattempts_in_place(
    cluster: ClusterConfig, one_job: list[JobConfig], tmp_path: Path
) -> None:
    r = run(cluster, one_job, SEV3, tmp_path, "unicron")
    assert r.summary["downtime_s"] == pytest.approx(EXCEPTION_S + DEBOUNCE_S + A100.reattempt_s)
    assert r.summary["failures"] == 1 and r.summary["job_hits"] == 1
    assert gpus_at(r, 3 * HOUR) == [32]


def test_sev3_restart_pays_the_papers_68_minutes(
    cluster: ClusterConfig, one_job: list[JobConfig], tmp_path: Path
) -> None:
    r = run(cluster, one_job, SEV3, tmp_path, "restart")
    assert r.summary["downtime_s"] == pytest.approx(TIMEOUT_S + RESUBMIT_S + SETUP_S + 900.0)
    assert r.summary["downtime_s"] == pytest.approx(68 * 60)


@pytest.mark.parametrize("name", ["oobleck", "bamboo"])
def test_sev3_reconfiguring_baselines_lose_the_node_briefly(
    cluster: ClusterConfig, one_job: list[JobConfig], tmp_path: Path, name: str
) -> None:
    r = run(cluster, one_job, SEV3, tmp_path, name)
    assert RECONFIGURE_S < r.summary["downtime_s"] < 4 * RECONFIGURE_S
    assert gpus_at(r, 3600 + 10) == [24]  # the node is out until its processes relaunch
    assert gpus_at(r, 3 * HOUR) == [32]


def test_sev3_varuna_restarts_from_its_checkpoint(
    cluster: ClusterConfig, one_job: list[JobConfig], tmp_path: Path
) -> None:
    r = run(cluster, one_job, SEV3, tmp_path, "varuna")
    # exit seen in 1 s, relaunch, checkpoint read, half of a 30-min interval redone
    assert 1 + A100.launch_s + 900 < r.summary["downtime_s"] < 1 + A100.launch_s + 960


def test_sev1_unicron_shrinks_then_grows_back(
    cluster: ClusterConfig, one_job: list[JobConfig], tmp_path: Path
) -> None:
    r = run(cluster, one_job, "3600,1,ecc,3600\n", tmp_path, "unicron")
    assert gpus_at(r, 3600 + 60) == [24]
    assert gpus_at(r, 2 * HOUR + 60) == [32]
    assert r.summary["downtime_s"] < 200  # two in-place transitions, state from peers


def test_sev1_restart_waits_for_the_drain_and_stays_small(
    cluster: ClusterConfig, one_job: list[JobConfig], tmp_path: Path
) -> None:
    r = run(cluster, one_job, "3600,1,ecc,3600\n", tmp_path, "restart", hours=6.0)
    assert r.summary["downtime_s"] == pytest.approx(DRAIN_S + RESUBMIT_S + SETUP_S + 900.0)
    assert gpus_at(r, 5 * HOUR) == [24]  # fixed size until its next restart


def test_hang_unicron_detects_from_step_times(
    cluster: ClusterConfig, one_job: list[JobConfig], tmp_path: Path
) -> None:
    hang = run(cluster, one_job, "3600,2,task_hang,0\n", tmp_path, "unicron")
    crash = run(cluster, one_job, "3600,2,cuda_error,0\n", tmp_path, "unicron")
    sim_step = hang.summary["downtime_s"] - crash.summary["downtime_s"] + EXCEPTION_S - 0.5
    assert sim_step > 0  # 3 x iteration + 0.5 s instead of 0.2 s
    assert crash.summary["downtime_s"] < A100.launch_s + 30  # restart in place, peer state


def test_failure_on_an_idle_node_hits_nobody(cluster: ClusterConfig, tmp_path: Path) -> None:
    small = [JobConfig("gpt", 1.3, 1.0, 8, 8)]
    for name in ("unicron", "restart", "oobleck", "varuna", "bamboo"):
        r = run(cluster, small, "3600,3,cuda_error,0\n", tmp_path, name)
        assert r.summary["job_hits"] == 0 and r.summary["downtime_s"] == 0, name
