"""Data-parallel step with exact optimizer semantics for any world size, for any model.

A step's global batch is ``M = global_batch / micro_batch`` micro-batches numbered 0..M-1.
Rank ``r`` of ``W`` takes the indices ``i`` with ``i % W == r``; each rank sums the gradients of
its micro-batches' mean losses, one all-reduce (SUM) adds up the ranks, and dividing by ``M``
gives the gradient of the global batch's mean loss — the update a single process would make.

:func:`train_step` is the one definition of a step. It is a generator so that the forward and
backward stay in the caller's hands (a user's loop body, see :mod:`unicron.train`): it yields
each micro-batch index this rank owes, the caller hands the micro-batch's mean loss to
:meth:`StepWork.add`, and after the last one the step reduces and updates. :func:`drive` runs
it with a loss function instead, for callers that have one (references, benchmarks).

A step's work (:class:`StepWork`) outlives a failed collective: after an in-place regroup the
group completes the step from the micro-batches the survivors already summed plus the ones
nobody covered, each counted exactly once, which the all-reduce itself checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from unicron.trainer.comm import all_reduce_sum

T = TypeVar("T")

# What a step generator yields (micro-batch indices, or batches built from them) and returns.
StepGenerator = Generator[T, None, float]


class NonFiniteLossError(FloatingPointError):
    """The global loss of a step was NaN or infinite; training would only get worse."""


class StepInterrupted(Exception):
    """A regroup directive arrived between two micro-batches; the work done so far is kept."""


class MicroBatchCountError(RuntimeError):
    """The all-reduce counted some micro-batch other than exactly once: a bug, never trained."""


class BackwardMisuseError(RuntimeError):
    """``backward`` was not called exactly once for a micro-batch handed out."""


class StepHooks(Protocol):
    """Told where a step is, so a monitor can time this rank's own compute and tell the
    agent which phase a silent rank is stuck in (its compute or the collective)."""

    def before_compute(self, step: int) -> None: ...

    def before_collective(self, step: int) -> None: ...

    def after_collective(self, step: int) -> None: ...


class Scheduler(Protocol):
    """A learning-rate scheduler as torch's are: stepped once per optimizer step."""

    def step(self) -> None: ...

    def state_dict(self) -> dict[str, object]: ...

    def load_state_dict(self, state_dict: dict[str, object]) -> None: ...


def micro_batches_for(rank: int, world: int, total: int) -> list[int]:
    """Micro-batch indices that ``rank`` of ``world`` computes out of ``total`` (round robin)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world of {world}")
    return list(range(rank, total, world))


@dataclass
class StepWork:
    """One step's micro-batches on this rank: those summed into ``.grad`` so far (``done``,
    with their loss sum) and those still to do. Kept across a failed collective, so the
    step can be completed after a regroup without redoing them (docs/design.md §5)."""

    step: int
    todo: list[int]
    done: list[int] = field(default_factory=list)
    loss_sum: torch.Tensor | None = None
    # Filled by the all-reduce: how often each index was counted over the group (all ones).
    counted: list[int] | None = None
    # The index handed to the caller whose loss has not come back yet.
    pending: int | None = None

    def add(self, loss: torch.Tensor) -> None:
        """Sum the gradient of the pending micro-batch's mean ``loss`` into ``.grad``."""
        index = self.pending
        if index is None:
            raise BackwardMisuseError("backward() called twice for one micro-batch, or outside")
        torch.autograd.backward(loss)
        detached = loss.detach().float()
        self.loss_sum = detached if self.loss_sum is None else self.loss_sum + detached
        self.todo.remove(index)
        self.done.append(index)
        self.pending = None


def new_work(step: int, rank: int, world: int, total: int) -> StepWork:
    return StepWork(step, micro_batches_for(rank, world, total))


def reduce_work(
    model: nn.Module, work: StepWork, total: int, group: dist.ProcessGroup | None
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
        all_reduce_sum(flat, group)
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
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    work: StepWork,
    total: int,
    group: dist.ProcessGroup | None,
    hooks: StepHooks | None = None,
    interrupted: Callable[[], bool] | None = None,
    scheduler: Scheduler | None = None,
) -> StepGenerator[int]:
    """One optimizer step on the global batch of ``work.step``; returns its mean loss.

    Yields each index of ``work.todo``; before asking for the next, the caller passes that
    micro-batch's mean loss to ``work.add``. Micro-batches already in ``work.done`` (the rest
    of an interrupted step) are kept. Raises :class:`StepInterrupted` between two micro-batches
    when ``interrupted()`` says so, and :class:`NonFiniteLossError` before touching the
    weights when the loss is not finite; every rank sees the same reduced loss, so all of
    them raise together.
    """
    step = work.step
    if hooks is not None:
        hooks.before_compute(step)
    if not work.done:
        optimizer.zero_grad(set_to_none=True)
    while work.todo:
        if interrupted is not None and interrupted():
            raise StepInterrupted(f"step {step} interrupted with {len(work.done)} done")
        work.pending = work.todo[0]
        yield work.pending
        if work.pending is not None:
            raise BackwardMisuseError(f"micro-batch {work.pending} of step {step}: no backward()")
    if hooks is not None:
        hooks.before_collective(step)
    loss, work.counted = reduce_work(model, work, total, group)
    if hooks is not None:
        hooks.after_collective(step)
    if not math.isfinite(loss):
        raise NonFiniteLossError(f"non-finite loss {loss} at step {step}")
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return loss


def drive(
    steps: StepGenerator[T], loss_of: Callable[[T], torch.Tensor], work: Callable[[], StepWork]
) -> float:
    """Run a step generator to its end, giving ``work().add`` the loss of each item it
    yields; returns the step's mean loss."""
    try:
        item = next(steps)
        while True:
            work().add(loss_of(item))
            item = steps.send(None)
    except StopIteration as stop:
        loss: float = stop.value
        return loss
