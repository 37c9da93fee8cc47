"""The baseline's workload with checkpoint-and-resume: :mod:`bench.torchrun_job` plus a disk
checkpoint by rank 0 every ``BENCH_CHECKPOINT_EVERY`` steps (default 10) in ``$BENCH_CKPT``,
and a resume from the newest one when torchrun restarts the group. Every marker line also says
which step the group resumed from, so the benchmark can count the steps that were redone.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from bench.torchrun_job import mark
from unicron.shared.models import JobSpec, ModelConfig
from unicron.trainer import checkpoint
from unicron.trainer.gpt import make_optimizer, train_step
from unicron.trainer.model import build_model


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    markers, ckpt_dir = os.environ["BENCH_MARKERS"], os.environ["BENCH_CKPT"]
    every = int(os.environ.get("BENCH_CHECKPOINT_EVERY", "10"))
    spec = JobSpec(
        name="torchrun-ckpt",
        steps=100_000,
        global_batch=8,
        micro_batch=2,
        model=ModelConfig(n_layer=2, n_head=2, d_model=64, seq_len=32, vocab=64),
    )
    model = build_model(spec.model, spec.seed, torch.device("cpu"))
    optimizer = make_optimizer(model)
    found = checkpoint.load_latest(ckpt_dir) if rank == 0 else None
    payload: list[object] = [found]
    dist.broadcast_object_list(payload, src=0)
    start = 0
    received = payload[0]
    if isinstance(received, tuple):
        checkpoint.restore(model, optimizer, received[1])
        start = int(received[0])
    pid = os.getpid()
    mark(markers, event="start", rank=rank, pid=pid, restart=restart, resumed=start, t=time.time())
    for step in range(start + 1, spec.steps + 1):
        train_step(model, optimizer, spec, step, rank, world, dist.group.WORLD)
        if rank == 0 and step % every == 0:
            checkpoint.save(ckpt_dir, step, checkpoint.capture(model, optimizer, step))
        mark(
            markers, event="step", rank=rank, pid=pid, restart=restart, step=step, resumed=start,
            t=time.time(),
        )  # fmt: skip


if __name__ == "__main__":
    main()
