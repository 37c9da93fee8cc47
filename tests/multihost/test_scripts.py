"""A plain script's checkpoints follow it to another host (issue 20).

A two-rank DDP script (tests/multihost/scripts/resume.py) keeps its own checkpoint under
``$UNICRON_CHECKPOINT_DIR``, a directory on its rank 0's host. The test cuts that host's link:
the job restarts on the other two hosts, and the new rank 0, on a host that never ran it,
resumes from the checkpoint its old rank 0 wrote, which the agents mirrored through the bus.
Run it with ``make test-multihost``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.multihost.cluster import NODES, Cluster, record_figures, wait_for

pytestmark = pytest.mark.multihost

SCRIPTS = Path(__file__).resolve().parent / "scripts"
JOB = {
    "name": "script-checkpoints",
    "entrypoint": ["python", "resume.py"],  # a bare python is the agent's interpreter
    "working_dir": str(SCRIPTS),  # every host sees this machine's files
    "min_workers": 2,
    "max_workers": 2,
}


def rank0(job: dict[str, Any]) -> str:
    return str(next(w["node_id"] for w in job["workers"] if w["rank"] == 0))


def rank0_log(cluster: Cluster, job: dict[str, Any]) -> Path:
    return cluster.data / rank0(job) / "logs" / job["id"] / f"g{job['generation']}-r0.log"


def numbers(pattern: str, log: Path) -> list[int]:
    text = log.read_text() if log.exists() else ""
    return [int(n) for n in re.findall(pattern, text)]


def mirrored(cluster: Cluster, node: str, job_id: str) -> int:
    """How many snapshots of the job the agent on ``node`` has sent."""
    log = cluster.data / "logs" / node
    lines = log.read_text().splitlines() if log.exists() else []
    return sum("checkpoint directory mirrored" in line and job_id in line for line in lines)


def running(api: httpx.Client, cluster: Cluster, job_id: str, after: int) -> Any:
    job = cluster.job(api, job_id)
    ok = job["state"] == "RUNNING" and job["generation"] > after and len(job["workers"]) == 2
    return job if ok else None


def test_a_script_resumes_on_another_host_from_the_checkpoint_its_rank_0_wrote(
    cluster: Cluster,
) -> None:
    figures: dict[str, float] = {}
    with cluster.api() as api:
        wait_for("three READY nodes", lambda: cluster.ready_nodes(api) == set(NODES), 90)
        response = api.post("/v1/jobs", json=JOB)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        job = wait_for("2 ranks running", lambda: running(api, cluster, job_id, 0), 120)
        old, log = rank0(job), rank0_log(cluster, job)
        first = wait_for("rank 0 started", lambda: numbers(r"resumed from step (\d+)", log), 120)
        assert first == [0]
        wait_for("two checkpoints mirrored", lambda: mirrored(cluster, old, job_id) >= 2, 120)

        cut_at = time.monotonic()
        cluster.net.cut(old)
        written = numbers(r"checkpoint at step (\d+)", log)
        new = wait_for("the restart elsewhere", lambda: running(api, cluster, job_id, 1), 120)
        assert rank0(new) != old and old not in {w["node_id"] for w in new["workers"]}
        new_log = rank0_log(cluster, new)
        resumed = wait_for(
            "the new rank 0 resumed", lambda: numbers(r"resumed from step (\d+)", new_log), 120
        )[0]
        figures["script_resume_s"] = time.monotonic() - cut_at
        assert api.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    cluster.net.restore(old)

    # a checkpoint the old rank 0 wrote, not a start from zero: the newest mirrored one
    assert resumed in written and resumed >= 40, (resumed, written)
    figures["script_resumed_step"] = resumed
    figures["script_steps_behind_last_checkpoint"] = max(written) - resumed
    record_figures(figures)
