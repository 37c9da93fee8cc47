"""The baseline's workload with checkpoint-and-resume: :mod:`bench.torchrun_job` plus a disk
checkpoint by rank 0 every ``BENCH_CHECKPOINT_EVERY`` steps (default 10) in ``$BENCH_CKPT``,
and a resume from the newest one when torchrun restarts the group. Every marker line also says
which step the group resumed from, so the benchmark can count the steps that were redone.
"""

from __future__ import annotations

import os
import time

import torch.distributed as dist
from unicron.trainer import checkpoint
from unicron.trainer.gpt import train_step

from bench.torchrun_job import join, mark


def main() -> None:
    w = join("torchrun-ckpt")
    markers, ckpt_dir = os.environ["BENCH_MARKERS"], os.environ["BENCH_CKPT"]
    every = int(os.environ.get("BENCH_CHECKPOINT_EVERY", "10"))
    found = checkpoint.load_latest(ckpt_dir) if w.rank == 0 else None
    payload: list[object] = [found]
    dist.broadcast_object_list(payload, src=0)
    start = 0
    received = payload[0]
    if isinstance(received, tuple):
        checkpoint.restore(w.model, w.optimizer, received[1])
        start = int(received[0])
    pid = os.getpid()
    mark(
        markers, event="start", rank=w.rank, pid=pid, restart=w.restart, resumed=start,
        t=time.time(),
    )  # fmt: skip
    for step in range(start + 1, w.spec.steps + 1):
        train_step(w.model, w.optimizer, w.spec, step, w.rank, w.world, dist.group.WORLD)
        if w.rank == 0 and step % every == 0:
            checkpoint.save(ckpt_dir, step, checkpoint.capture(w.model, w.optimizer, step))
        mark(
            markers, event="step", rank=w.rank, pid=pid, restart=w.restart, step=step,
            resumed=start, t=time.time(),
        )  # fmt: skip


if __name__ == "__main__":
    main()
