"""The GPU path on a real device (issue 21): `make test-gpu`, or bench/gpu_check.sh on a lent
machine. Where CUDA is absent every test is skipped with that reason.

Two NCCL ranks share the one GPU a test machine has: each agent, and so each of its workers,
gets its own ``NCCL_HOSTID``, a test-only trick that makes NCCL treat the two processes as two
hosts (otherwise it refuses them: "Duplicate GPU detected"). Production never needs it: an
agent gives each rank a GPU of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from unicron.cli.stack import Stack, StackConfig
from unicron.shared.procs import free_port

from tests.e2e.conftest import get_job, small_job
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine"),
]
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "ddp_to_unicron"
FIGURES = Path(os.environ.get("UNICRON_GPU_FIGURES", ".unicron/gpu.json"))


def record(**figures: float) -> None:
    """Figures for bench/gpu_check.sh's table, one JSON object."""
    known = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    known.update({k: round(v, 4) for k, v in figures.items()})
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(known) + "\n")


def local_run(tmp_path: Path, steps: int) -> str:
    spec = tmp_path / f"job-{steps}.json"
    spec.write_text(json.dumps({"name": "gpu-local", "steps": steps, "checkpoint_every": 10}))
    env = {**os.environ, "UNICRON_JOB_SPEC": str(spec), "UNICRON_CHECKPOINT_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "train_unicron.py"], cwd=EXAMPLE, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def test_the_training_api_runs_on_cuda_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    local_run(tmp_path, steps=20)
    resumed = local_run(tmp_path, steps=30)
    assert "resumed" in resumed and "step=20" in resumed, resumed[-3000:]


def stack_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where a test's stack keeps its logs: under ``UNICRON_GPU_LOGS`` when set, so that a lent
    machine's run brings back the agents' and workers' logs (NCCL's errors among them)."""
    logs = os.environ.get("UNICRON_GPU_LOGS")
    return Path(logs) / request.node.name if logs else tmp_path / "stack"


@pytest.fixture
def two_ranks(
    nats_url: str, redis_url: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[httpx.Client]:
    # both agents on the one GPU: a stack shares a host's GPUs out (cli/gpushare.py) and with
    # one GPU for two agents would hide it, so the test hands it to each by hand
    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    nodes = {
        f"node-{i}": {"NCCL_HOSTID": f"unicron-gpu-test-{i}", "CUDA_VISIBLE_DEVICES": gpu}
        for i in range(2)
    }
    config = StackConfig(
        nodes=2, slots=1, nats_url=nats_url, redis_url=redis_url, api_port=free_port(),
        data_dir=stack_dir(request, tmp_path), node_env=nodes,
    )  # fmt: skip
    with Stack(config) as stack, httpx.Client(base_url=stack.api_url, timeout=10) as api:
        yield api


def stepping(api: httpx.Client, job_id: str, after: int) -> dict[str, Any] | None:
    job = get_job(api, job_id)
    ok = job["state"] == "RUNNING" and job["stepping"] and job["generation"] > after
    return job if ok and len(job["workers"]) == 2 else None


def test_two_nccl_ranks_recover_in_place_from_a_sigkill(two_ranks: httpx.Client) -> None:
    api = two_ranks
    response = api.post("/v1/jobs", json=small_job("gpu-nccl", steps=100_000, min_workers=2,
                                                   max_workers=2))  # fmt: skip
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    job = wait_for("2 NCCL ranks stepping", lambda: stepping(api, job_id, 0), 180)
    survivor = next(w for w in job["workers"] if w["rank"] == 0)
    victim = next(w for w in job["workers"] if w["rank"] == 1)
    killed_at = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL)
    job = wait_for("the regroup", lambda: stepping(api, job_id, job["generation"]), 120)
    record(nccl_sigkill_recovery_s=time.monotonic() - killed_at)
    assert job["transition_kind"] == "in_place" and job["transition_fallback"] is None, job
    kept = [w for w in job["workers"] if w["node_id"] == survivor["node_id"]]
    assert [w["pid"] for w in kept] == [survivor["pid"]]  # the survivor kept its process
    api.post(f"/v1/jobs/{job_id}/cancel")


@pytest.mark.parametrize(
    ("fault", "category"),
    [("cuda_text", "illegal_memory"), ("sigstop", "task_hang")],
)
def test_a_cuda_error_and_a_hang_on_nccl_are_classified_and_recovered(
    two_ranks: httpx.Client, fault: str, category: str
) -> None:
    api = two_ranks
    response = api.post("/v1/jobs", json=small_job(f"gpu-{fault}", steps=100_000, min_workers=2,
                                                   max_workers=2))  # fmt: skip
    job_id = response.json()["id"]
    job = wait_for("2 NCCL ranks stepping", lambda: stepping(api, job_id, 0), 180)
    victim = next(w for w in job["workers"] if w["rank"] == 1)
    began = time.monotonic()
    if fault == "sigstop":
        os.kill(victim["pid"], signal.SIGSTOP)
    else:
        drill = {"rank": 1, "kind": "exception",
                 "message": "CUDA error: an illegal memory access was encountered"}  # fmt: skip
        assert api.post(f"/v1/jobs/{job_id}/faults", json=drill).status_code == 202
    job = wait_for("the recovery", lambda: stepping(api, job_id, job["generation"]), 180)
    record(**{f"nccl_{fault}_recovery_s": time.monotonic() - began})
    assert job["last_failure"]["category"] == category, job["last_failure"]
    api.post(f"/v1/jobs/{job_id}/cancel")


def test_each_cuda_device_is_placed_on_its_nvml_gpu() -> None:
    """The agent names the rank on a faulty GPU by matching NVML's GPU to its CUDA device
    (services/agent/gpuowners.py): on the real device, by index under PCI order and by UUID."""
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed")
    from unicron.services.agent.gpus import SlotPool, visible_devices
    from unicron.services.agent.nvml import open_session

    devices = visible_devices()  # sets CUDA_DEVICE_ORDER=PCI_BUS_ID unless it was set
    session = open_session(lambda: pynvml)
    try:
        by_index, by_uuid = SlotPool(devices), SlotPool([str(u) for u in _cuda_uuids()])
        placed = {gpu.index: by_index.place(gpu.index, gpu.uuid) for gpu in session.gpus}
        placed_by_uuid = {gpu.index: by_uuid.place(gpu.index, gpu.uuid) for gpu in session.gpus}
    finally:
        session.close()
    ours = {i: p.slot for i, p in placed.items() if p.ours}
    assert len(ours) == len(devices) and all(p.known for p in placed.values()), placed
    assert {i: p.slot for i, p in placed_by_uuid.items() if p.ours} == ours
    record(nvml_gpus_placed=float(len(ours)))


def _cuda_uuids() -> list[str]:
    """Each visible CUDA device's UUID as CUDA_VISIBLE_DEVICES takes it (``GPU-…``)."""
    count = torch.cuda.device_count()
    uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(count)]
    return [u if u.startswith("GPU-") else f"GPU-{u}" for u in uuids]


def test_a_warm_spare_leaves_cuda_alone_until_its_launch_names_the_device() -> None:
    """A spare warms up before it knows its GPU, and CUDA reads CUDA_VISIBLE_DEVICES once, when
    it starts: a warm-up that started CUDA would keep every GPU visible to the rank it becomes,
    which would then train on the first GPU, another rank's. Here the launch hides every GPU: a
    spare that left CUDA alone sees none."""
    probe = (
        "import os, torch\n"
        "from unicron.trainer.spare import warm_up\n"
        "warm_up()\n"
        "os.environ['CUDA_VISIBLE_DEVICES'] = ''  # what run_script does with a launch's env\n"
        "print(torch.cuda.is_available(), torch.cuda.device_count())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "0"], done.stdout
