"""The recovery baseline: ``torchrun --max-restarts=3`` over a job that checkpoints every 10
steps (:mod:`bench.torchrun_ckpt_job`), its workers SIGKILLed one at a time; each trial is the
kill against the first completed step of the next restart group, and the steps redone."""

from __future__ import annotations

import os
import random
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.torchrun_baseline import TorchrunJob
from bench.trials import Series, Trial, progress


class CheckpointingTorchrun(TorchrunJob):
    """``TorchrunJob`` running :mod:`bench.torchrun_ckpt_job` with ``--max-restarts=3``."""

    def __init__(self, workdir: Path, nproc: int = 4, max_restarts: int = 3) -> None:
        super().__init__(
            workdir, nproc, "bench.torchrun_ckpt_job", max_restarts,
            BENCH_CKPT=str(workdir / "ckpt"), BENCH_CHECKPOINT_EVERY="10",
        )  # fmt: skip

    def first_step(self, restart: int, timeout_s: float = 180.0) -> dict[str, Any]:
        """The first completed step of group ``restart`` (every rank's step has the same t)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            steps = [m for m in self.marks() if m["restart"] == restart and m["event"] == "step"]
            if steps:
                return min(steps, key=lambda m: m["t"])
            time.sleep(0.02)
        raise TimeoutError(f"torchrun group {restart} never stepped")

    def wait_progress(self, restart: int, steps: int, timeout_s: float = 180.0) -> dict[int, int]:
        """Pids by rank once every rank of group ``restart`` did ``steps`` steps in it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            marks = [m for m in self.marks() if m["restart"] == restart and m["event"] == "step"]
            done: dict[int, list[dict[str, Any]]] = {}
            for mark in marks:
                done.setdefault(mark["rank"], []).append(mark)
            if len(done) == 4 and all(len(v) >= steps for v in done.values()):
                return {rank: int(v[-1]["pid"]) for rank, v in done.items()}
            time.sleep(0.05)
        raise TimeoutError(f"torchrun group {restart} did not make {steps} steps")

    def last_step(self, restart: int) -> int:
        steps = [
            m["step"] for m in self.marks() if m["restart"] == restart and m["event"] == "step"
        ]
        return max(steps, default=0)


def torchrun_crashes(trials: int, max_restarts: int = 3) -> Series:
    series = Series("torchrun crash (ckpt every 10)")
    done = 0
    while done < trials:
        with tempfile.TemporaryDirectory(
            prefix="torchrun-recover-", ignore_cleanup_errors=True
        ) as tmp:
            job = CheckpointingTorchrun(Path(tmp), max_restarts=max_restarts)
            try:
                for restart in range(min(max_restarts, trials - done)):
                    pids = job.wait_progress(restart, random.randint(8, 20))
                    step_before = job.last_step(restart)
                    killed_at = time.time()
                    os.kill(pids[random.randrange(4)], signal.SIGKILL)
                    first = job.first_step(restart + 1)
                    series.trials.append(
                        Trial(
                            recover_s=first["t"] - killed_at,
                            lost_steps=max(0, step_before - int(first["resumed"])),
                            source="disk" if first["resumed"] else "none",
                            kind="restart",
                        )
                    )
                    progress(series)
                    done += 1
            finally:
                job.stop()
    return series
