"""The recovery baseline: ``torchrun --max-restarts=3`` over a job that checkpoints every 10
steps, its workers SIGKILLed one at a time; each trial is the kill against the first completed
step of the next restart group, and the steps redone.

The job is :mod:`bench.torchrun_ckpt_job` (the GPT rows) or :mod:`bench.user_ddp` (the
user-script rows). :class:`MarkerLog` reads the per-step markers both write; the Unicron
entrypoint row reads the same markers of the same script (:mod:`bench.user_recover`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.torchrun_baseline import TorchrunJob
from bench.trials import Series, Trial, progress


class MarkerLog:
    """The JSON markers (one per rank and step: rank, pid, restart group, step, resumed, t)."""

    def __init__(self, path: Path, ranks: int = 4) -> None:
        self.path = path
        self.ranks = ranks

    def steps(self, restart: int | None = None) -> list[dict[str, Any]]:
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        marks = [json.loads(line) for line in lines if line.endswith("}")]
        return [
            m
            for m in marks
            if m["event"] == "step" and (restart is None or m["restart"] == restart)
        ]

    def first_step_after(self, restart: int, timeout_s: float = 180.0) -> dict[str, Any]:
        """The first completed step of a restart group above ``restart``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            later = [m for m in self.steps() if m["restart"] > restart]
            if later:
                return min(later, key=lambda m: m["t"])
            time.sleep(0.02)
        raise TimeoutError(f"no restart group after {restart} stepped")

    def wait_progress(self, restart: int, steps: int, timeout_s: float = 180.0) -> dict[int, int]:
        """Pids by rank once every rank of group ``restart`` did ``steps`` steps in it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done: dict[int, list[dict[str, Any]]] = {}
            for mark in self.steps(restart):
                done.setdefault(mark["rank"], []).append(mark)
            if len(done) == self.ranks and all(len(v) >= steps for v in done.values()):
                return {rank: int(v[-1]["pid"]) for rank, v in done.items()}
            time.sleep(0.05)
        raise TimeoutError(f"restart group {restart} did not make {steps} steps")

    def last_step(self, restart: int) -> int:
        return max((m["step"] for m in self.steps(restart)), default=0)


def kill_trial(log: MarkerLog, restart: int, kind: str) -> tuple[Trial, int]:
    """SIGKILL a random rank of group ``restart`` after 8-20 steps; the trial and the group
    that recovered."""
    pids = log.wait_progress(restart, random.randint(8, 20))
    step_before = log.last_step(restart)
    killed_at = time.time()
    os.kill(pids[random.randrange(len(pids))], signal.SIGKILL)
    first = log.first_step_after(restart)
    trial = Trial(
        recover_s=first["t"] - killed_at,
        lost_steps=max(0, step_before - int(first["resumed"])),
        source="disk" if first["resumed"] else "none",
        kind=kind,
    )
    return trial, int(first["restart"])


def torchrun_crashes(
    trials: int,
    module: str = "bench.torchrun_ckpt_job",
    name: str = "torchrun crash (ckpt every 10)",
    max_restarts: int = 3,
) -> Series:
    series = Series(name)
    while len(series.trials) < trials:
        with tempfile.TemporaryDirectory(
            prefix="torchrun-recover-", ignore_cleanup_errors=True
        ) as tmp:
            job = TorchrunJob(
                Path(tmp), 4, module, max_restarts,
                BENCH_CKPT=str(Path(tmp) / "ckpt"), BENCH_CHECKPOINT_EVERY="10",
            )  # fmt: skip
            log = MarkerLog(job.markers)
            try:
                restart = 0
                for _ in range(min(max_restarts, trials - len(series.trials))):
                    trial, restart = kill_trial(log, restart, "restart")
                    series.trials.append(trial)
                    progress(series)
            finally:
                job.stop()
    return series
