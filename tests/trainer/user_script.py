"""A user's own training script on the public API only, as tests run it:
``python -m tests.trainer.user_script``.

A small MLP on a map-style ``TensorDataset`` with AdamW and a step scheduler. Test knobs:
``USER_FAIL_AT="<rank>:<step>"`` raises an out-of-memory error in the loop body there;
``USER_SPEC`` (JobSpec JSON) is the spec of a local run outside Unicron; ``USER_OUT`` is
where rank 0 saves the final weights after the loop.
"""

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset
from unicron.shared.contracts.models import JobSpec

import unicron.train


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(40, 8, generator=generator)
    return TensorDataset(inputs, (inputs.sum(dim=1) > 0).long())


def main() -> None:
    local_spec = os.environ.get("USER_SPEC")
    run = unicron.train.init(spec=JobSpec.model_validate_json(local_spec) if local_spec else None)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    run.wrap(model, optimizer, scheduler=scheduler)
    for x, y in run.batches(dataset()):
        if os.environ.get("USER_FAIL_AT") == f"{run.rank}:{run.step}":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        run.backward(F.cross_entropy(model(x), y))
    if run.rank == 0 and "USER_OUT" in os.environ:
        torch.save(model.state_dict(), os.environ["USER_OUT"])


if __name__ == "__main__":
    main()
