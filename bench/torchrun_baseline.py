"""torchrun side by side: how long TorchElastic takes to notice the same crash and hang.

Runs :mod:`bench.torchrun_job` under ``torchrun --standalone --nproc-per-node 4
--max-restarts 1`` with its default monitor interval; a fault is "noticed" when torchrun says
so on stderr (it reports the failed worker, sends SIGTERM, or restarts the group) or a new
group starts. A hang is only noticed at the collective timeout; the wait is capped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

NOTICED = re.compile(r"failed|FAILED|SIGTERM|[Rr]estart|ChildFailedError|exitcode")


class TorchrunJob:
    """``torchrun --standalone`` over a bench job ``module`` that appends JSON markers (one per
    step, with its rank, pid and restart group) to ``workdir/markers.jsonl``."""

    def __init__(
        self,
        workdir: Path,
        nproc: int = 4,
        module: str = "bench.torchrun_job",
        max_restarts: int = 1,
        **env_extra: str,
    ) -> None:
        self.markers = workdir / "markers.jsonl"
        self.markers.touch()
        env = dict(os.environ, BENCH_MARKERS=str(self.markers),
                   TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1",
                   **env_extra)  # fmt: skip
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}", "-m", module,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
            start_new_session=True, text=True,
        )  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.time(), line))

    def marks(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.markers.read_text().splitlines() if line]

    def wait_steps(self, restart: int, steps: int, timeout_s: float = 120.0) -> dict[int, int]:
        """Pids by rank of group ``restart`` once every rank has done ``steps`` steps."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = [m for m in self.marks() if m["restart"] == restart and m["event"] == "step"]
            by_rank = {m["rank"]: m for m in done if m["step"] >= steps}
            if len(by_rank) == 4:
                return {rank: int(m["pid"]) for rank, m in by_rank.items()}
            time.sleep(0.05)
        raise TimeoutError(f"torchrun group {restart} did not reach step {steps}")

    def noticed_after(self, started: float, restart: int, cap_s: float) -> float | None:
        deadline = started + cap_s
        while time.time() < deadline:
            said = [t for t, line in self.lines if t >= started and NOTICED.search(line)]
            regrouped = [m["t"] for m in self.marks() if m["restart"] > restart]
            seen = said + [float(t) for t in regrouped]
            if seen:
                return min(seen) - started
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in {int(m["pid"]) for m in self.marks()}:  # workers may sit in other groups
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def torchrun_crash_and_hang(cap_s: float = 120.0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="torchrun-bench-", ignore_cleanup_errors=True) as tmp:
        job = TorchrunJob(Path(tmp))
        try:
            pids = job.wait_steps(restart=0, steps=5)
            started = time.time()
            os.kill(pids[1], signal.SIGKILL)
            crash_s = job.noticed_after(started, restart=0, cap_s=cap_s)
            pids = job.wait_steps(restart=1, steps=5)
            started = time.time()
            os.kill(pids[1], signal.SIGSTOP)
            hang_s = job.noticed_after(started, restart=1, cap_s=cap_s)
            print(
                f"torchrun: crash noticed after {crash_s} s, hang after {hang_s} s", file=sys.stderr
            )
        finally:
            job.stop()
    return {
        "crash_s": crash_s if crash_s is not None else cap_s,
        "hang_s": hang_s if hang_s is not None else cap_s,
        "hang_note": "" if hang_s is not None else f" (not noticed; capped at {cap_s:.0f} s)",
    }


if __name__ == "__main__":
    print(json.dumps(torchrun_crash_and_hang()))
