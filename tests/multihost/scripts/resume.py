"""A user's plain DDP script that keeps its own checkpoint, as scripts do: rank 0 writes
``state.json`` under ``$UNICRON_CHECKPOINT_DIR`` every 40 steps (write, then rename) and, on
start, resumes from it and tells the other ranks. It knows nothing of Unicron but the directory
torchrun's environment and that variable name; it runs until it is stopped."""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist

EVERY = 40


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    path = os.path.join(os.environ["UNICRON_CHECKPOINT_DIR"], "state.json")
    start = torch.zeros(1, dtype=torch.int64)
    if rank == 0 and os.path.exists(path):
        with open(path) as saved:
            start[0] = json.load(saved)["step"]
    dist.broadcast(start, 0)
    step = int(start.item())
    print(f"resumed from step {step}", flush=True)
    while True:
        total = torch.ones(1)
        dist.all_reduce(total)
        time.sleep(0.05)
        step += 1
        if rank == 0 and step % EVERY == 0:
            with open(path + ".tmp", "w") as out:
                json.dump({"step": step}, out)
            os.replace(path + ".tmp", path)
            print(f"checkpoint at step {step}", flush=True)


if __name__ == "__main__":
    main()
