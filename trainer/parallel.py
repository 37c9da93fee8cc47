"""Data-parallel step with exact optimizer semantics for any world size.

A step's global batch is ``M = global_batch / micro_batch`` micro-batches numbered 0..M-1.
Rank ``r`` of ``W`` takes the indices ``i`` with ``i % W == r``; each rank sums the gradients of
its micro-batches' mean losses, one all-reduce (SUM) adds up the ranks, and dividing by ``M``
gives the gradient of the global batch's mean loss — the update a single process would make.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.distributed as dist

from shared.models import JobSpec
from trainer.data import micro_batch
from trainer.model import GPT

# Fixed by design: the reference trainer has no schedule so resumed runs need no extra state.
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 0.01


class NonFiniteLossError(FloatingPointError):
    """The global loss of a step was NaN or infinite; training would only get worse."""


class StepHooks(Protocol):
    """Told where a step is, so a monitor can time this rank's own compute and tell the
    agent which phase a silent rank is stuck in (its compute or the collective)."""

    def before_compute(self, step: int) -> None: ...

    def before_collective(self, step: int) -> None: ...


def micro_batches_for(rank: int, world: int, total: int) -> list[int]:
    """Micro-batch indices that ``rank`` of ``world`` computes out of ``total`` (round robin)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world of {world}")
    return list(range(rank, total, world))


def make_optimizer(model: GPT) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)


def local_gradients(model: GPT, spec: JobSpec, step: int, indices: list[int]) -> torch.Tensor:
    """Accumulate into ``.grad`` the summed gradients of this rank's micro-batches and return
    the sum of their losses (a 0-d tensor, zero when the rank has no micro-batch)."""
    device = next(model.parameters()).device
    loss_sum = torch.zeros((), device=device)
    for index in indices:
        inputs, targets = micro_batch(spec.seed, step, index, spec.micro_batch, spec.model)
        loss = model.loss(inputs.to(device), targets.to(device))
        torch.autograd.backward(loss)
        loss_sum += loss.detach()
    return loss_sum


def all_reduce_mean(
    model: GPT, loss_sum: torch.Tensor, total: int, group: dist.ProcessGroup | None
) -> float:
    """Turn every rank's summed gradients and loss into the global means, in place.

    Gradients and the loss travel in one flat buffer so a step costs a single collective.
    ``group=None`` means a single process with nothing to reduce.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss_sum.reshape(1)])
    if group is not None:
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    flat /= total
    offset = 0
    for param, grad in zip(params, grads, strict=True):
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        param.grad = grad
        offset += grad.numel()
    return float(flat[-1])


def train_step(
    model: GPT,
    optimizer: torch.optim.Optimizer,
    spec: JobSpec,
    step: int,
    rank: int,
    world: int,
    group: dist.ProcessGroup | None,
    hooks: StepHooks | None = None,
) -> float:
    """One optimizer step on the global batch of ``step``; returns its mean loss.

    Raises :class:`NonFiniteLossError` before touching the weights when the loss is not
    finite; every rank sees the same reduced loss, so all of them raise together.
    """
    if hooks is not None:
        hooks.before_compute(step)
    optimizer.zero_grad(set_to_none=True)
    indices = micro_batches_for(rank, world, spec.micro_batches)
    loss_sum = local_gradients(model, spec, step, indices)
    if hooks is not None:
        hooks.before_collective(step)
    loss = all_reduce_mean(model, loss_sum, spec.micro_batches, group)
    if not math.isfinite(loss):
        raise NonFiniteLossError(f"non-finite loss {loss} at step {step}")
    optimizer.step()
    return loss
