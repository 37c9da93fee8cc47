"""The user-script workload (:mod:`bench.user_job`) as a plain torchrun-style DDP script.

Unmodified for both launchers: ``torchrun -m bench.user_ddp`` and a Unicron entrypoint job
(``python -m bench.user_ddp``). Rank 0 checkpoints every ``BENCH_CHECKPOINT_EVERY`` steps into
``$UNICRON_CHECKPOINT_DIR`` (else ``$BENCH_CKPT``) and every rank resumes from the newest one;
each rank appends a JSON marker to ``$BENCH_MARKERS`` after every step, with the restart group
(``TORCHELASTIC_RESTART_COUNT``) and the step it resumed from, so the bench counts redone steps.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from bench.torchrun_job import mark
from bench.user_job import GLOBAL_BATCH, STEPS, dataset, model


def batches(start: int) -> Iterator[Any]:
    """Batches from step ``start + 1`` on, epoch after epoch (resumed at the epoch's start)."""
    data = dataset()
    sampler: DistributedSampler[Any] = DistributedSampler(data, seed=0)
    loader = DataLoader(data, GLOBAL_BATCH // dist.get_world_size(), sampler=sampler)
    epoch = start // len(loader)
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, pid = dist.get_rank(), os.getpid()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    markers, every = os.environ["BENCH_MARKERS"], int(os.environ["BENCH_CHECKPOINT_EVERY"])
    path = Path(os.environ.get("UNICRON_CHECKPOINT_DIR") or os.environ["BENCH_CKPT"]) / "ckpt.pt"
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    start = 0
    if path.exists():
        state = torch.load(path, weights_only=True)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
    ddp = DistributedDataParallel(net)
    for step, (x, y) in zip(range(start + 1, STEPS + 1), batches(start), strict=False):
        loss = F.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if rank == 0 and step % every == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            torch.save(state, path.with_suffix(".tmp"))
            path.with_suffix(".tmp").replace(path)  # atomic: a restart never reads half a file
        mark(markers, event="step", rank=rank, pid=pid, restart=restart, step=step,
             resumed=start, t=time.time())  # fmt: skip


if __name__ == "__main__":
    main()
