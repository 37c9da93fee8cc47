"""The baseline's workload: the reference GPT trained with plain torch.distributed under torchrun.

Each worker appends one JSON line to ``$BENCH_MARKERS`` when it starts and after every step,
so the benchmark sees which restart of the worker group is running and how far it got.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from unicron.shared.contracts.models import JobSpec, ModelConfig
from unicron.trainer.gpt import make_optimizer, train_step
from unicron.trainer.model import GPT, build_model


def mark(path: str, **fields: object) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(fields) + "\n")


@dataclass(frozen=True)
class Worker:
    """One torchrun worker of a baseline job: its place in the group and what it trains."""

    rank: int
    world: int
    restart: int
    spec: JobSpec
    model: GPT
    optimizer: torch.optim.Optimizer


def join(name: str) -> Worker:
    """Join torchrun's gloo group and build the small GPT every baseline job trains, so the
    plain and the checkpointing baselines measure the same work."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    spec = JobSpec(
        name=name,
        steps=100_000,
        global_batch=8,
        micro_batch=2,
        model=ModelConfig(n_layer=2, n_head=2, d_model=64, seq_len=32, vocab=64),
    )
    model = build_model(spec.model, spec.seed, torch.device("cpu"))
    return Worker(
        rank=dist.get_rank(),
        world=dist.get_world_size(),
        restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        spec=spec,
        model=model,
        optimizer=make_optimizer(model),
    )


def main() -> None:
    w = join("torchrun-baseline")
    markers = os.environ["BENCH_MARKERS"]
    mark(markers, event="start", rank=w.rank, pid=os.getpid(), restart=w.restart, t=time.time())
    for step in range(1, w.spec.steps + 1):
        train_step(w.model, w.optimizer, w.spec, step, w.rank, w.world, dist.group.WORLD)
        mark(
            markers,
            event="step",
            rank=w.rank,
            pid=os.getpid(),
            restart=w.restart,
            step=step,
            t=time.time(),
        )


if __name__ == "__main__":
    main()
