"""The root cause of a plain script's failure, through the whole stack: a two-rank DDP script on
gloo whose last rank fails while its peer sees the connection drop. Whichever rank's exit the
detector hears first, the failing rank is named with its own exception or signal, the job
fails after exactly ``max_restarts`` restarts, and no node is blamed.

torch's own excepthook (installed by ``init_process_group``) writes the tracebacks as
``[rankN]: …``; with ``record`` the script also writes torchelastic's error file."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from unicron.cli.stack import Stack

from tests.e2e.conftest import assert_no_node_blamed, failures_of, wait_terminal
from tests.e2e.test_entrypoints import entrypoint_job, submit

pytestmark = pytest.mark.timeout(300)
MAX_RESTARTS = 2

# argv: fault (raise | segv), delay (s the failing rank lives on after breaking the group),
# peer delay (s a survivor lives on after its collective failed), record (yes | no)
BAD_RANK_SCRIPT = textwrap.dedent(
    """
    import ctypes, os, sys, time
    import torch
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.nn.parallel import DistributedDataParallel

    FAULT, DELAY, PEER_DELAY = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])


    def main():
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = DistributedDataParallel(torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(10):
            if rank == world - 1 and step == 5:
                fail(step)
            try:
                loss = model(torch.randn(4, 8)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            except RuntimeError:  # the peer is gone
                time.sleep(PEER_DELAY)
                raise
            time.sleep(0.05)


    def fail(step):
        if DELAY:  # peers see the connection drop now, this rank's own exit comes later
            dist.destroy_process_group()
            time.sleep(DELAY)
        if FAULT == "segv":
            ctypes.string_at(0)
        raise ValueError(f"step {step}: bad batch shape (4, 7) in {os.environ['RANK']}")


    (record(main) if sys.argv[4] == "yes" else main)()
    """
)


def run_failing(api: httpx.Client, tmp_path: Path, *args: str) -> dict[str, Any]:
    (tmp_path / "train.py").write_text(BAD_RANK_SCRIPT)
    spec = entrypoint_job(
        "bad-rank",
        [sys.executable, "train.py", *args],
        working_dir=str(tmp_path),
        min_workers=2,
        max_workers=2,
        max_restarts=MAX_RESTARTS,
    )
    return wait_terminal(api, submit(api, spec), timeout_s=240)


def assert_blamed_on_the_code(job: dict[str, Any], api: httpx.Client, redis_url: str) -> None:
    assert job["state"] == "FAILED", job["history"]
    assert job["recoveries"] == MAX_RESTARTS, job["history"]
    assert job["code_failures"] == MAX_RESTARTS + 1
    assert "max_restarts" in job["history"][-1]["reason"]
    seen = failures_of(api, job["id"])
    assert len(seen) == MAX_RESTARTS + 1, seen
    for failure in seen:  # every generation blamed the failing rank, none escalated
        assert (failure["rank"], failure["category"]) == (1, "software_other"), failure
        assert (failure["severity"], failure["action"]) == ("SEV2", "restart"), failure
    assert_no_node_blamed(api, redis_url)


@pytest.mark.parametrize(
    ("delay", "peer_delay", "recorded"),
    [
        pytest.param("0", "3", "no", id="its-exit-first", marks=pytest.mark.extended),
        pytest.param("0.5", "0", "yes", id="its-exit-last-error-file"),
        # the same order as the second, seconds apart: the slow suite's (28 s)
        pytest.param("4", "0", "no", id="its-exit-seconds-after", marks=pytest.mark.slow),
    ],
)
def test_the_rank_that_raised_is_named_whatever_order_the_exits_arrive_in(
    stack: Stack,
    api: httpx.Client,
    tmp_path: Path,
    redis_url: str,
    delay: str,
    peer_delay: str,
    recorded: str,
) -> None:
    job = run_failing(api, tmp_path, "raise", delay, peer_delay, recorded)
    assert_blamed_on_the_code(job, api, redis_url)
    last = job["last_failure"]
    assert (last["exc_type"], last["rank"]) == ("ValueError", 1), last
    assert last["message"].startswith("step 5: bad batch shape (4, 7) in 1"), last
    assert "ValueError: step 5: bad batch shape (4, 7)" in job["history"][-1]["reason"]


@pytest.mark.extended  # tests/detector/test_script_root_cause.py names signals from their reports
def test_a_rank_killed_by_sigsegv_is_named_with_the_signal(
    stack: Stack, api: httpx.Client, tmp_path: Path, redis_url: str
) -> None:
    job = run_failing(api, tmp_path, "segv", "2", "0", "no")
    assert_blamed_on_the_code(job, api, redis_url)
    last = job["last_failure"]
    assert (last["kind"], last["exc_type"], last["rank"]) == ("crash", "SIGSEGV", 1), last
    assert "killed by SIGSEGV" in last["message"]
