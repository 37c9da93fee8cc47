"""The baseline's workload: the reference GPT trained with plain torch.distributed under torchrun.

Each worker appends one JSON line to ``$BENCH_MARKERS`` when it starts and after every step,
so the benchmark sees which restart of the worker group is running and how far it got.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist

from unicron.shared.models import JobSpec, ModelConfig
from unicron.trainer.gpt import make_optimizer, train_step
from unicron.trainer.model import build_model


def mark(path: str, **fields: object) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(fields) + "\n")


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    markers = os.environ["BENCH_MARKERS"]
    spec = JobSpec(
        name="torchrun-baseline",
        steps=100_000,
        global_batch=8,
        micro_batch=2,
        model=ModelConfig(n_layer=2, n_head=2, d_model=64, seq_len=32, vocab=64),
    )
    model = build_model(spec.model, spec.seed, torch.device("cpu"))
    optimizer = make_optimizer(model)
    mark(markers, event="start", rank=rank, pid=os.getpid(), restart=restart, t=time.time())
    for step in range(1, spec.steps + 1):
        train_step(model, optimizer, spec, step, rank, world, dist.group.WORLD)
        mark(
            markers,
            event="step",
            rank=rank,
            pid=os.getpid(),
            restart=restart,
            step=step,
            t=time.time(),
        )


if __name__ == "__main__":
    main()
