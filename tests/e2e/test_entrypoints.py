"""User entrypoint jobs through the whole stack: an unmodified torchrun-style DDP script that
survives a SIGKILLed rank, a script whose own bug fails the job after max_restarts, and a job
whose code arrives on the agents as an uploaded package."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
from unicron.cli.packages import pack
from unicron.cli.stack import Stack

from tests.e2e.conftest import get_job, wait_for, wait_terminal

# Written for torchrun: the process group comes from the environment, the checkpoint is its own.
DDP_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    STEPS = int(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt = os.path.join(os.environ["UNICRON_CHECKPOINT_DIR"], "ddp.pt")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    if rank == 0:
        with open(os.environ["PROGRESS"], "a") as f:
            f.write(f"start {start} world {world}\\n")
    for step in range(start, STEPS):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 4 == 3:
            state = {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}
            torch.save(state, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
            with open(os.environ["PROGRESS"], "a") as f:
                f.write(f"saved {step}\\n")
        time.sleep(0.1)
    dist.destroy_process_group()
    """
)

FAILING_SCRIPT = textwrap.dedent(
    """
    import os
    for step in range(10):
        if step == 5:
            raise ValueError(f"boom at step {step} of {os.environ['UNICRON_JOB_ID']}")
    """
)

WHERE_SCRIPT = "import os\nopen(os.environ['OUT'], 'a').write(os.getcwd() + '\\n')\n"


def entrypoint_job(name: str, argv: list[str], **fields: Any) -> dict[str, Any]:
    return {"name": name, "entrypoint": argv, "global_batch": 8, "micro_batch": 2, **fields}


def submit(api: httpx.Client, spec: dict[str, Any]) -> str:
    response = api.post("/v1/jobs", json=spec)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_torchrun_ddp_script_survives_a_killed_rank(
    stack: Stack, api: httpx.Client, tmp_path: Path
) -> None:
    script, progress = tmp_path / "train.py", tmp_path / "progress"
    script.write_text(DDP_SCRIPT)
    spec = entrypoint_job(
        "ddp",
        [sys.executable, "train.py", "32"],
        working_dir=str(tmp_path),
        env={"PROGRESS": str(progress)},
        min_workers=2,
        max_workers=2,
    )
    job_id = submit(api, spec)
    running = wait_for("the job to run", lambda: get_job(api, job_id)["state"] == "RUNNING")
    assert running
    wait_for("a checkpoint", lambda: any(line.startswith("saved") for line in lines(progress)))
    job = get_job(api, job_id)
    assert job["step"] == 0  # a plain script reports no steps, yet it runs
    victim = next(w for w in job["workers"] if w["rank"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)

    job = wait_terminal(api, job_id, timeout_s=150)
    assert job["state"] == "SUCCEEDED", job["history"]
    assert job["recoveries"] >= 1
    failure = job["last_failure"]
    assert (failure["kind"], failure["rank"], failure["exc_type"]) == ("crash", 1, "SIGKILL")
    assert failure["category"] == "exited_abnormally" and job["code_failures"] == 0
    starts = [line for line in lines(progress) if line.startswith("start")]
    assert starts[0] == "start 0 world 2"
    assert len(starts) >= 2 and not starts[-1].startswith("start 0 ")  # resumed from its own


def test_a_bug_fails_the_job_after_max_restarts_and_a_missing_command_at_once(
    stack: Stack, api: httpx.Client, tmp_path: Path
) -> None:
    (tmp_path / "fail.py").write_text(FAILING_SCRIPT)
    spec = entrypoint_job(
        "buggy", [sys.executable, "fail.py"], working_dir=str(tmp_path), max_workers=1
    )
    spec["max_restarts"] = 1
    job_id = submit(api, spec)
    missing_id = submit(api, entrypoint_job("missing", ["/no/such/program"], max_workers=1))
    job = wait_terminal(api, job_id, timeout_s=90)
    assert job["state"] == "FAILED", job["history"]
    assert job["recoveries"] == 1  # one restart, then it gave up
    failure = job["last_failure"]
    assert (failure["exc_type"], failure["category"]) == ("ValueError", "software_other")
    assert failure["message"].startswith(f"boom at step 5 of {job_id}")
    assert "ValueError: boom at step 5" in job["history"][-1]["reason"]
    assert "max_restarts" in job["history"][-1]["reason"]

    # a command that cannot be executed fails its job at once, naming it: no restart loop
    missing = wait_terminal(api, missing_id, timeout_s=60)
    assert missing["state"] == "FAILED" and missing["recoveries"] == 0
    assert "/no/such/program" in missing["history"][-1]["reason"]


def test_a_packaged_job_runs_from_its_unpacked_dir(
    stack: Stack, api: httpx.Client, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "where.py").write_text(WHERE_SCRIPT)
    data = pack(code)
    sha = hashlib.sha256(data).hexdigest()
    stored = api.post("/v1/packages", params={"sha256": sha}, content=data)
    assert stored.status_code == 201, stored.text
    out = tmp_path / "where.txt"
    spec = entrypoint_job(
        "packaged",
        [sys.executable, "where.py"],
        working_dir=stored.json()["working_dir"],
        env={"OUT": str(out)},
        max_workers=2,
        min_workers=2,
    )
    job_id = submit(api, spec)
    job = wait_terminal(api, job_id, timeout_s=90)
    assert job["state"] == "SUCCEEDED", job["history"]
    cwds = set(lines(out))
    assert len(cwds) == 1, cwds  # both agents of this machine share the data dir
    (cwd,) = cwds
    assert Path(cwd).parts[-2:] == ("workdirs", job_id) and Path(cwd, "where.py").is_file()
