"""Data-parallel step with exact optimizer semantics for any world size.

A step's global batch is ``M = global_batch / micro_batch`` micro-batches numbered 0..M-1.
Rank ``r`` of ``W`` takes the indices ``i`` with ``i % W == r``; each rank sums the gradients of
its micro-batches' mean losses, one all-reduce (SUM) adds up the ranks, and dividing by ``M``
gives the gradient of the global batch's mean loss — the update a single process would make.

A step's work (:class:`StepWork`) outlives a failed collective: after an in-place regroup the
group completes the step from the micro-batches the survivors already summed plus the ones
nobody covered, each counted exactly once, which the all-reduce itself checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist

from unicron.shared.models import JobSpec
from unicron.trainer.data import micro_batch
from unicron.trainer.model import GPT

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

    def after_collective(self, step: int) -> None: ...


def micro_batches_for(rank: int, world: int, total: int) -> list[int]:
    """Micro-batch indices that ``rank`` of ``world`` computes out of ``total`` (round robin)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world of {world}")
    return list(range(rank, total, world))


def make_optimizer(model: GPT) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)


class StepInterrupted(Exception):
    """A regroup directive arrived between two micro-batches; the work done so far is kept."""


class MicroBatchCountError(RuntimeError):
    """The all-reduce counted some micro-batch other than exactly once: a bug, never trained."""


@dataclass
class StepWork:
    """One step's micro-batches on this rank: those summed into ``.grad`` so far (``done``,
    with their loss sum) and those still to do. Kept across a failed collective, so the
    step can be completed after a regroup without redoing them (DESIGN.md §5)."""

    step: int
    todo: list[int]
    done: list[int] = field(default_factory=list)
    loss_sum: torch.Tensor | None = None
    # Filled by the all-reduce: how often each index was counted over the group (all ones).
    counted: list[int] | None = None


def new_work(step: int, rank: int, world: int, total: int) -> StepWork:
    return StepWork(step, micro_batches_for(rank, world, total))


def accumulate(
    model: GPT, spec: JobSpec, work: StepWork, interrupted: Callable[[], bool] | None = None
) -> None:
    """Sum the gradients of ``work.todo``'s micro-batches into ``.grad``, one at a time,
    moving each to ``work.done``; raises :class:`StepInterrupted` between two of them when
    ``interrupted()`` says so."""
    device = next(model.parameters()).device
    if work.loss_sum is None:
        work.loss_sum = torch.zeros((), device=device)
    while work.todo:
        if interrupted is not None and interrupted():
            raise StepInterrupted(f"step {work.step} interrupted with {len(work.done)} done")
        index = work.todo[0]
        inputs, targets = micro_batch(spec.seed, work.step, index, spec.micro_batch, spec.model)
        loss = model.loss(inputs.to(device), targets.to(device))
        torch.autograd.backward(loss)
        work.loss_sum += loss.detach()
        work.done.append(work.todo.pop(0))


def local_gradients(model: GPT, spec: JobSpec, step: int, indices: list[int]) -> torch.Tensor:
    """Accumulate into ``.grad`` the summed gradients of this rank's micro-batches and return
    the sum of their losses (a 0-d tensor, zero when the rank has no micro-batch)."""
    work = StepWork(step, list(indices))
    accumulate(model, spec, work)
    assert work.loss_sum is not None
    return work.loss_sum


def reduce_work(
    model: GPT, work: StepWork, total: int, group: dist.ProcessGroup | None
) -> tuple[float, list[int]]:
    """Turn every rank's summed gradients and loss into the global means, in place; returns
    the mean loss and how many times each micro-batch index was counted (all ones).

    Gradients, the loss and a one-hot count of the micro-batches each rank summed travel in
    one flat buffer, so a step costs a single collective and proves its own sample ledger.
    ``group=None`` means a single process with nothing to reduce.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    device = params[0].device
    loss_sum = work.loss_sum if work.loss_sum is not None else torch.zeros((), device=device)
    counts = torch.zeros(total, device=device, dtype=loss_sum.dtype)
    counts[work.done] = 1.0
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss_sum.reshape(1), counts])
    if group is not None:
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    counted = [round(c) for c in flat[-total:].tolist()]
    if any(c != 1 for c in counted):
        raise MicroBatchCountError(f"step {work.step}: micro-batch counts {counted}")
    flat = flat[:-total] / total
    offset = 0
    for param, grad in zip(params, grads, strict=True):
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        param.grad = grad
        offset += grad.numel()
    return float(flat[-1]), counted


def train_step(
    model: GPT,
    optimizer: torch.optim.Optimizer,
    spec: JobSpec,
    step: int,
    rank: int,
    world: int,
    group: dist.ProcessGroup | None,
    hooks: StepHooks | None = None,
    work: StepWork | None = None,
    interrupted: Callable[[], bool] | None = None,
) -> float:
    """One optimizer step on the global batch of ``step``; returns its mean loss.

    ``work`` carries micro-batches already summed (the rest of an interrupted step); without
    it this rank's round-robin share starts from zero gradients. Raises
    :class:`NonFiniteLossError` before touching the weights when the loss is not finite;
    every rank sees the same reduced loss, so all of them raise together.
    """
    if hooks is not None:
        hooks.before_compute(step)
    if work is None:
        work = new_work(step, rank, world, spec.micro_batches)
    if not work.done:
        optimizer.zero_grad(set_to_none=True)
    accumulate(model, spec, work, interrupted)
    if hooks is not None:
        hooks.before_collective(step)
    loss, work.counted = reduce_work(model, work, spec.micro_batches, group)
    if hooks is not None:
        hooks.after_collective(step)
    if not math.isfinite(loss):
        raise NonFiniteLossError(f"non-finite loss {loss} at step {step}")
    optimizer.step()
    return loss
