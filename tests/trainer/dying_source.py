"""A state source that dies mid-transfer, for tests: ``python -m tests.trainer.dying_source``.

It joins the process group of ``UNICRON_WORKER_LAUNCH`` as that launch's rank, takes part in
the hand-off's all-gather claiming to hold the state of ``UNICRON_TEST_NEXT_STEP``, and then
exits before the broadcast its joiner is waiting for.
"""

from __future__ import annotations

import os

import torch.distributed as dist
from unicron.trainer.exits import exit_now
from unicron.trainer.handoff import Holding
from unicron.trainer.runtime import RuntimeOptions, join_process_group
from unicron.trainer.worker import read_launch


def main() -> int:
    launch = read_launch()
    group = join_process_group(launch, "gloo", RuntimeOptions())
    holding = Holding(has_state=True, next_step=int(os.environ["UNICRON_TEST_NEXT_STEP"]))
    gathered: list[object] = [None] * launch.world_size
    dist.all_gather_object(gathered, holding, group=group)
    return 0  # gone before the broadcast


if __name__ == "__main__":
    exit_now(main())
