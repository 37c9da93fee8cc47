"""A script on the ``unicron.train`` API as an entrypoint job through the whole stack: the
example of examples/ddp_to_unicron loses a rank mid-training, heals in place and ends with the
parameters of a failure-free run, every micro-batch of every step used exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import yaml
from unicron.cli.stack import Stack
from unicron.trainer.ledger import read_ledger

from tests.e2e.conftest import get_job, wait_for, wait_terminal

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_to_unicron"
STEPS = 1000  # seconds of training: time for the drill to reach rank 1 on a loaded machine


def example_job() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    spec.update(steps=STEPS, min_workers=2, max_workers=2, checkpoint_every=50)
    return spec | {"working_dir": str(EXAMPLE)}


def reference_weights(spec: dict[str, Any], tmp_path: Path) -> dict[str, torch.Tensor]:
    """The same job file run as one local process, outside Unicron."""
    job_file, checkpoints = tmp_path / "job.yaml", tmp_path / "reference"
    job_file.write_text(yaml.safe_dump(spec))
    env = dict(os.environ, UNICRON_JOB_SPEC=str(job_file), UNICRON_CHECKPOINT_DIR=str(checkpoints))
    subprocess.run(
        [sys.executable, "train_unicron.py"], cwd=EXAMPLE, env=env, check=True, timeout=180
    )
    return weights(checkpoints / f"step-{STEPS}.pt")


def weights(path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    return dict(state["model"])


@pytest.mark.extended  # tests/trainer/test_train_api.py heals the same script exactly
def test_an_api_script_heals_in_place_and_ends_with_failure_free_weights(
    stack: Stack, api: httpx.Client, tmp_path: Path
) -> None:
    spec = example_job()
    expected = reference_weights(spec, tmp_path)
    response = api.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    wait_for("the job to step", lambda: get_job(api, job_id)["step"] >= 5)
    drill = {"rank": 1, "kind": "crash", "at_step": STEPS // 3}
    assert api.post(f"/v1/jobs/{job_id}/faults", json=drill).status_code == 202

    job = wait_terminal(api, job_id, timeout_s=150)
    assert job["state"] == "SUCCEEDED", job["history"]
    assert job["last_failure"]["kind"] == "crash" and job["last_failure"]["rank"] == 1
    assert job["recoveries"] == 1
    # the new generation's first step ended the transition (not merely its workers starting)
    assert any(h["reason"] == "generation 2 stepping" for h in job["history"]), job["history"]
    checkpoints = stack.config.data_dir / "checkpoints" / job_id
    got = weights(checkpoints / f"step-{STEPS}.pt")
    for name, tensor in expected.items():
        assert torch.allclose(got[name], tensor, rtol=0, atol=1e-5), name
    ledger = read_ledger(checkpoints)
    # each step once (a restart from disk would have redone some), each micro-batch once in it
    assert [e.step for e in ledger] == list(range(1, STEPS + 1))
    assert all(set(e.counted) == {1} for e in ledger)
    assert len({e.generation for e in ledger}) == 2
