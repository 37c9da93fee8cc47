"""Which samples make micro-batch ``i`` of step ``s``: a user's data as a pure function.

Exact elastic training needs the data order to be a function of ``(seed, step, index)``
only, so that any rank of any world size, a survivor redoing a lost rank's share or a run
resumed from disk, builds the same micro-batch (docs/design.md §5). :func:`source_of` turns what a
user passes to ``run.batches`` into such a function:

- a map-style dataset (``__len__`` and ``__getitem__``): the job's samples are read as one
  endless stream of positions, ``global_batch`` per step and ``micro_batch`` per micro-batch
  in order; position ``p`` is sample ``perm_e[p mod N]`` of epoch ``e = p // N``, where
  ``perm_e`` is a permutation seeded by ``(seed, e)``. Every sample of an epoch is used once,
  and a micro-batch is collated with ``torch.utils.data.default_collate``;
- a callable ``source(step, index) -> batch``, which is trusted to be such a function already.

Batches are moved to the rank's device (tensors inside tuples, lists and dicts).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import default_collate
from unicron.shared.contracts.models import JobSpec
from unicron.trainer.data import derive_seed

Source = Callable[[int, int], Any]

# Mixed into the permutation seed so the data order is independent of the model's init.
_PERMUTATION_SALT = 0x5045524D


@runtime_checkable
class MapDataset(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


@functools.lru_cache(maxsize=4)
def epoch_permutation(seed: int, epoch: int, size: int) -> torch.Tensor:
    """The order of the ``size`` samples in ``epoch`` (a few epochs cached: a step's
    micro-batches straddle at most two)."""
    generator = torch.Generator().manual_seed(derive_seed(seed, _PERMUTATION_SALT, epoch))
    return torch.randperm(size, generator=generator)


def sample_indices(spec: JobSpec, size: int, step: int, index: int) -> list[int]:
    """Dataset indices of micro-batch ``index`` of ``step`` (1-based) for a dataset of ``size``."""
    if size <= 0:
        raise ValueError("the dataset is empty")
    first = (step - 1) * spec.global_batch + index * spec.micro_batch
    positions = torch.arange(first, first + spec.micro_batch)
    epochs, offsets = positions // size, positions % size
    samples = torch.empty_like(positions)
    for epoch in torch.unique(epochs).tolist():
        where = epochs == epoch
        samples[where] = epoch_permutation(spec.seed, int(epoch), size)[offsets[where]]
    return [int(i) for i in samples.tolist()]


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, list | tuple) and not hasattr(batch, "_fields"):
        return type(batch)(to_device(item, device) for item in batch)
    return batch


def _collated(dataset: MapDataset, spec: JobSpec, size: int, step: int, index: int) -> Any:
    return default_collate([dataset[i] for i in sample_indices(spec, size, step, index)])


def source_of(data: MapDataset | Source, spec: JobSpec, device: torch.device) -> Source:
    """``fetch(step, index) -> batch`` for ``data`` on ``device`` (see module doc)."""
    fetch: Source
    if isinstance(data, MapDataset):
        fetch = functools.partial(_collated, data, spec, len(data))
    elif callable(data):
        fetch = data
    else:
        raise TypeError("batches() takes a map-style dataset or a callable (step, index)")
    if device.type == "cpu":
        return fetch
    return lambda step, index: to_device(fetch(step, index), device)
