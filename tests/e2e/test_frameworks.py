"""The frameworks users run, unmodified, through the whole stack: the PyTorch Lightning and
Hugging Face ``Trainer`` examples (examples/lightning, examples/hf_trainer) as entrypoint jobs
on two ranks. A SIGKILLed rank restarts the job and the framework resumes from the checkpoint
it wrote under ``$UNICRON_CHECKPOINT_DIR``; a bug in the training step fails the job after
``max_restarts`` naming the exception, with no node blamed; each rank's log stays readable.

Slow (``make test-slow``, which installs the ``frameworks`` extra); skipped without it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from unicron.cli.stack import Stack

from tests.e2e.conftest import (
    assert_no_node_blamed,
    failures_of,
    get_job,
    wait_for,
    wait_terminal,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
INSTALL = "the frameworks extra is not installed: pip install -e '.[frameworks]' torch==2.13.0"
START = re.compile(r"^training from step (\d+) on 2 ranks$", re.MULTILINE)
BUG = "planted bug in training_step at step 5"


def lightning_saved(checkpoints: Path) -> bool:
    return (checkpoints / "last.ckpt").is_file()


def hf_saved(checkpoints: Path) -> bool:
    # trainer_state.json is the last file the Trainer writes into a checkpoint-N folder
    return any(checkpoints.glob("checkpoint-*/trainer_state.json"))


@dataclass(frozen=True)
class Framework:
    example: str  # the folder under examples/
    module: str  # what the example imports
    saved: Callable[[Path], bool]  # a checkpoint to resume from is on disk
    resumed: re.Pattern[str]  # the framework's own words for loading it, in rank 0's log

    def spec(self, *args: str, **fields: Any) -> dict[str, Any]:
        """The example's job file as shipped, its entrypoint extended by ``args``."""
        spec: dict[str, Any] = yaml.safe_load((EXAMPLES / self.example / "job.yaml").read_text())
        spec["entrypoint"] = [*spec["entrypoint"], *args]
        return spec | fields | {"working_dir": str(EXAMPLES / self.example)}


FRAMEWORKS = [
    Framework(
        "lightning",
        "lightning",
        lightning_saved,
        re.compile(r"Restored all states from the checkpoint at (\S+/last\.ckpt)"),
    ),
    Framework(
        "hf_trainer",
        "transformers",
        hf_saved,
        re.compile(r"resuming from (\S+/checkpoint-(\d+))"),
    ),
]


@pytest.fixture(params=FRAMEWORKS, ids=[f.example for f in FRAMEWORKS])
def framework(request: pytest.FixtureRequest) -> Framework:
    chosen: Framework = request.param
    pytest.importorskip(chosen.module, reason=INSTALL)
    if chosen.module == "transformers":
        pytest.importorskip("accelerate", reason=INSTALL)
    return chosen


def submit(api: httpx.Client, spec: dict[str, Any]) -> str:
    response = api.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def rank_log(api: httpx.Client, job_id: str, rank: int, **params: int) -> str:
    """A rank's output through the API (the latest generation that ran, unless named)."""
    response = api.get(f"/v1/jobs/{job_id}/logs", params={"rank": rank, "tail": 10_000, **params})
    assert response.status_code == 200, response.text
    return response.text


def assert_readable(log: str) -> None:
    """Plain lines: no progress bars redrawn with carriage returns, no terminal colours."""
    assert log.strip(), "empty log"
    assert "\r" not in log and "\x1b" not in log, log[-2000:]


def test_a_killed_rank_restarts_and_the_framework_resumes_from_its_checkpoint(
    framework: Framework, stack: Stack, api: httpx.Client
) -> None:
    job_id = submit(api, framework.spec())
    checkpoints = stack.data_dir / "checkpoints" / job_id
    wait_for(
        "the job to run and its first checkpoint",
        lambda: get_job(api, job_id)["state"] == "RUNNING" and framework.saved(checkpoints),
        timeout_s=180,
    )
    first = get_job(api, job_id)
    drill = api.post(f"/v1/jobs/{job_id}/faults", json={"rank": 1, "kind": "crash"})
    assert drill.status_code == 202, drill.text  # the agent SIGKILLs the rank's process

    wait_for(
        "the job to run again in a new generation",
        lambda: (
            (j := get_job(api, job_id))["generation"] > first["generation"]
            and j["state"] == "RUNNING"
        ),
        timeout_s=120,
    )
    job = wait_terminal(api, job_id, timeout_s=240)
    assert job["state"] == "SUCCEEDED", job["history"]
    assert job["recoveries"] >= 1
    assert (job["last_failure"]["kind"], job["last_failure"]["rank"]) == ("crash", 1)

    before = rank_log(api, job_id, 0, generation=first["generation"])
    assert [int(s) for s in START.findall(before)] == [0]
    after = rank_log(api, job_id, 0)
    resumed = framework.resumed.search(after)
    assert resumed is not None, after[-3000:]
    assert len(framework.resumed.findall(after)) == 1, after[-3000:]  # each line once
    assert Path(resumed.group(1)).parent == checkpoints  # under $UNICRON_CHECKPOINT_DIR
    (start,) = (int(s) for s in START.findall(after))
    assert start > 0, after[-3000:]  # the step the framework's checkpoint was taken at
    for log in (before, after, rank_log(api, job_id, 1)):
        assert_readable(log)


def test_a_bug_in_the_training_step_fails_the_job_naming_it_and_blaming_no_node(
    framework: Framework, stack: Stack, api: httpx.Client, redis_url: str
) -> None:
    job_id = submit(api, framework.spec("--fail-at-step", "5", max_restarts=1))
    job = wait_terminal(api, job_id, timeout_s=300)
    assert job["state"] == "FAILED", job["history"]
    log = rank_log(api, job_id, 0)
    assert_readable(log)
    assert f"ValueError: {BUG}" in log and START.search(log), log[-3000:]

    assert_no_node_blamed(api, redis_url)
    failure = job["last_failure"]
    assert job["recoveries"] == 1, (job["recoveries"], failure)  # one restart, then gave up
    assert (failure["exc_type"], failure["category"]) == ("ValueError", "software_other"), failure
    assert BUG in failure["message"]
    assert f"ValueError: {BUG}" in job["history"][-1]["reason"]
    assert "max_restarts" in job["history"][-1]["reason"]
    detected = failures_of(api, job_id)
    assert len({f["generation"] for f in detected}) == 2, detected  # one per generation
    assert all(f["severity"] != "SEV1" for f in detected), detected
