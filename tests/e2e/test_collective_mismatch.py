"""A fault that follows the job is the job's, through the whole stack (issue 31): a plain
two-rank gloo script whose ranks resume from different steps issues mismatched collectives;
gloo aborts one rank with its enforce (a C++ exception on gloo's own thread: SIGABRT, the text
on stderr). Each generation fails the same way, so the job fails after exactly
``max_restarts`` restarts with the mismatch named, and no node is blamed."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from unicron.cli.stack import Stack

from tests.e2e.conftest import assert_no_node_blamed, failures_of, wait_terminal
from tests.e2e.test_entrypoints import entrypoint_job, submit

pytestmark = pytest.mark.timeout(240)
MAX_RESTARTS = 2

# Every fifth step syncs the whole state (528 floats) before the step's gradient (one float):
# ranks that disagree on the step send hundreds of bytes where their peer expects 4.
RESUMING_SCRIPT = textwrap.dedent(
    """
    from pathlib import Path
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    state, grad = torch.zeros(528), torch.ones(1)
    start = int(Path(f"checkpoint/rank{rank}.step").read_text())
    for step in range(start, start + 10):
        if step % 5 == 0:
            dist.all_reduce(state)
        dist.all_reduce(grad)
    print(f"rank {rank} trained from step {start}")
    """
)


@pytest.mark.extended  # three generations of two torch processes: about 30 s
def test_ranks_resuming_from_different_steps_fail_the_job_not_a_node(
    stack: Stack, api: httpx.Client, tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "train.py").write_text(RESUMING_SCRIPT)
    # The shards of the last checkpoint were saved at different steps: rank 1's save of step 5
    # never finished.
    (tmp_path / "checkpoint").mkdir()
    for rank, step in ((0, 5), (1, 4)):
        (tmp_path / "checkpoint" / f"rank{rank}.step").write_text(str(step))
    spec = entrypoint_job(
        "resumes",
        [sys.executable, "train.py"],
        working_dir=str(tmp_path),
        min_workers=2,
        max_workers=2,
        max_restarts=MAX_RESTARTS,
    )
    job = wait_terminal(api, submit(api, spec), timeout_s=180)
    assert job["state"] == "FAILED", job["history"]
    assert (job["recoveries"], job["code_failures"]) == (MAX_RESTARTS, MAX_RESTARTS + 1), job
    seen = failures_of(api, job["id"])
    assert len(seen) == MAX_RESTARTS + 1, seen
    for failure in seen:  # the rank gloo aborted, never escalated, never the node's
        assert (failure["rank"], failure["category"]) == (1, "collective_mismatch"), failure
        assert (failure["severity"], failure["action"]) == ("SEV2", "restart"), failure
        assert failure["exc_type"] == "gloo::EnforceNotMet", failure
        assert " vs 4. Received data size doesn't match" in failure["message"], failure
    reason = job["history"][-1]["reason"]
    assert "Is there a distributed collective mismatch in your code?" in reason, reason
    assert "collective_mismatch, the job's own code: failed after 2 restart(s)" in reason, reason
    assert_no_node_blamed(api, redis_url)
