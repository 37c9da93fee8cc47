"""A plain PyTorch DDP script, for torchrun: ``torchrun --nproc-per-node 2 train_ddp.py``

Unicron also runs it unchanged as an entrypoint job (restart semantics). ``train_unicron.py`` is
the same script on the ``unicron.train`` API, which gets every healing feature; ``diff`` the two.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def dataset() -> TensorDataset:
    """Points in 32-d labelled by the sign of the sum of their first four coordinates."""
    inputs = torch.randn(2048, 32, generator=torch.Generator().manual_seed(0))
    return TensorDataset(inputs, (inputs[:, :4].sum(dim=1) > 0).long())


def main() -> None:
    torch.set_num_threads(1)  # ranks on one machine share its cores
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model = DistributedDataParallel(model)
    data = dataset()
    loader = DataLoader(data, 32 // dist.get_world_size(), sampler=DistributedSampler(data))
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
