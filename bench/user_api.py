"""The user-script workload (:mod:`bench.user_job`) on the ``unicron.train`` API, as a Unicron
entrypoint job runs it: ``python -m bench.user_api`` in the repository root."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import unicron.train
from bench.user_job import dataset, model


def main() -> None:
    torch.set_num_threads(1)
    run = unicron.train.init()
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    run.wrap(net, optimizer)
    for x, y in run.batches(dataset()):
        run.backward(F.cross_entropy(net(x), y))


if __name__ == "__main__":
    main()
