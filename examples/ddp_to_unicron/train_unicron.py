"""``train_ddp.py`` on the ``unicron.train`` API: ``unicron submit job.yaml --working-dir .``

Every healing feature: in-band failure reports, in-place regroup, state from a live peer,
partial-step reuse with the sample ledger, warm spares, checkpoints. Steps and batch sizes come
from the job spec (``job.yaml``); ``python train_unicron.py`` runs it as one local process.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import unicron.train


def dataset() -> TensorDataset:
    """Points in 32-d labelled by the sign of the sum of their first four coordinates."""
    inputs = torch.randn(2048, 32, generator=torch.Generator().manual_seed(0))
    return TensorDataset(inputs, (inputs[:, :4].sum(dim=1) > 0).long())


def main() -> None:
    torch.set_num_threads(1)  # ranks on one machine share its cores
    torch.manual_seed(0)
    run = unicron.train.init()
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run.wrap(model, optimizer)
    data = dataset()
    loader = run.batches(data)
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        run.backward(loss)


if __name__ == "__main__":
    main()
