"""Jobs whose ranks sit on different "nodes": each launch names its own checkpoint directory,
as each agent derives one under its own data dir, and no directory is shared."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import torch
from unicron.shared.contracts.workerchannel import WorkerLaunch
from unicron.trainer import checkpoint

from tests.trainer.harness import DISCONNECTED, AgentStandIn, spawn

Report = dict[str, Any]


def run_ranks(agent: AgentStandIn, launches: list[WorkerLaunch], **env: str) -> list[Report]:
    """Run one worker process per launch to the end; returns every rank's reports, phases
    included (their ``kind`` is ``worker_phase``)."""
    procs = [spawn(launch, **env) for launch in launches]
    errors = [finish(proc) for proc in procs]
    assert all(error is None for error in errors), errors
    said = agent.collect(
        lambda got: sum(m["kind"] == DISCONNECTED for m in got) == len(launches), local=True
    )
    # Each connection's reports are queued before its end is: all of them are in.
    reports = []
    while not agent.lines.empty():
        reports.append(agent.lines.get_nowait())
    return said + reports


def finish(proc: subprocess.Popen[bytes], timeout_s: float = 90) -> str | None:
    """Wait for ``proc``; None when it exited 0, else its stderr."""
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return None if proc.returncode == 0 else err.decode(errors="replace")[-4000:]


def resumed_from(reports: list[Report]) -> set[int | None]:
    """Where each rank's first reported step says it resumed from."""
    firsts: dict[int, Report] = {}
    for report in reports:
        if report["kind"] == "step_completed":
            firsts.setdefault(report["rank"], report)
    return {report["resumed_from"] for report in firsts.values()}


def state_of(directory: Path, step: int) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(checkpoint.checkpoint_path(directory, step))
    return state


def assert_same_bits(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert got["step"] == expected["step"]
    for name, tensor in expected["model"].items():
        assert torch.equal(got["model"][name], tensor), name
    torch.testing.assert_close(got["optimizer"], expected["optimizer"], rtol=0, atol=0)
