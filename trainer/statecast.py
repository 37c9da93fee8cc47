"""Training state from one rank to the others: tensors as raw buffers, only the rest pickled.

A joiner's state transfer is on the critical path of every recovery it takes part in
(docs/design.md §5). Pickling a state dict copies each tensor through torch's serialization on
the sender and again on every receiver — for a GPT of 1.3 MB, 5-9 ms each way on a quiet core,
and for a real model gigabytes through host memory. Here the sender pickles only the state's
shape (its dicts, scalars and, for each tensor, a slot with its shape and dtype), then sends
the tensors of each dtype as one flat buffer, which the collective moves as it is: over gloo
on the CPU, over NCCL on the device. The receivers get views into those buffers, bit for bit
what was sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from unicron.trainer.comm import broadcast, broadcast_object

# What gloo and NCCL both move; a tensor of another dtype (bool, complex) travels pickled.
RAW_DTYPES = frozenset(
    {torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int8, torch.uint8}
)


@dataclass(frozen=True)
class _Slot:
    """Where a tensor was: its dtype's buffer, its offset and numel there, its shape."""

    dtype: torch.dtype
    offset: int
    numel: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Shape:
    skeleton: Any
    sizes: dict[torch.dtype, int]  # elements of each dtype's buffer, in send order


def broadcast_state(state: Any, src: int, group: dist.ProcessGroup, device: torch.device) -> Any:
    """``src``'s ``state`` (nested dicts, lists and tuples of tensors and plain values) on every
    rank; what the others pass is ignored. Received tensors are on ``device``."""
    mine = group.rank() == src
    tensors: dict[torch.dtype, list[torch.Tensor]] = {}
    sizes: dict[torch.dtype, int] = {}
    sent = _Shape(_hollow(state, tensors, sizes), sizes) if mine else None
    shape = broadcast_object(sent, src, group, device)
    assert isinstance(shape, _Shape)
    if mine:
        for dtype, parts in tensors.items():
            broadcast(_flat(parts, dtype, device), src, group)
        return state
    buffers = {}
    for dtype, size in shape.sizes.items():
        buffers[dtype] = torch.empty(size, dtype=dtype, device=device)
        broadcast(buffers[dtype], src, group)
    return _fill(shape.skeleton, buffers)


def _hollow(
    value: Any, tensors: dict[torch.dtype, list[torch.Tensor]], sizes: dict[torch.dtype, int]
) -> Any:
    """``value`` with each raw-movable tensor replaced by its slot: the tensor is appended to
    ``tensors`` and ``sizes`` counts its dtype's buffer so far."""
    if isinstance(value, torch.Tensor) and value.dtype in RAW_DTYPES:
        offset = sizes.get(value.dtype, 0)
        tensors.setdefault(value.dtype, []).append(value)
        sizes[value.dtype] = offset + value.numel()
        return _Slot(value.dtype, offset, value.numel(), tuple(value.shape))
    if isinstance(value, dict):
        return type(value)((k, _hollow(v, tensors, sizes)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value)(_hollow(v, tensors, sizes) for v in value)
    return value


def _fill(value: Any, buffers: dict[torch.dtype, torch.Tensor]) -> Any:
    if isinstance(value, _Slot):
        return buffers[value.dtype][value.offset : value.offset + value.numel].view(value.shape)
    if isinstance(value, dict):
        return type(value)((k, _fill(v, buffers)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value)(_fill(v, buffers) for v in value)
    return value


def _flat(parts: list[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if not parts:
        return torch.empty(0, dtype=dtype, device=device)
    return torch.cat([p.detach().reshape(-1).to(device) for p in parts])
