"""The workload of the user-script recovery rows: one small MLP task that two scripts train.

:mod:`bench.user_ddp` trains it as a plain torchrun-style DDP script (its own checkpoint every
``BENCH_CHECKPOINT_EVERY`` steps, JSON markers per step like :mod:`bench.torchrun_job`), and
:mod:`bench.user_api` trains the same model on the same data on ``unicron.train``. The sizes
give a step of a few tens of ms with four ranks on two cores, like the GPT rows.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

GLOBAL_BATCH, MICRO_BATCH, STEPS = 64, 16, 10_000_000
SAMPLES, FEATURES = 8192, 64
# What the Unicron side submits: the same batch sizes as the DDP script, checkpoints as often.
JOB_FIELDS = {
    "steps": STEPS, "global_batch": GLOBAL_BATCH, "micro_batch": MICRO_BATCH,
    "min_workers": 4, "max_workers": 4, "checkpoint_every": 10,
}  # fmt: skip


def dataset() -> TensorDataset:
    inputs = torch.randn(SAMPLES, FEATURES, generator=torch.Generator().manual_seed(0))
    return TensorDataset(inputs, (inputs[:, : FEATURES // 2].sum(dim=1) > 0).long())


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2)
    )
