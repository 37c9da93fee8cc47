"""The built-in GPT trainer (``trainer: "gpt"``), written as a user of :mod:`unicron.train`.

Nothing here is special to the runtime: the reference model of :mod:`unicron.trainer.model`, AdamW,
and the synthetic Markov data of :mod:`unicron.trainer.data` passed to ``run.batches`` as a
``source(step, index)``. :func:`train_step` is the same step driven with a loss function, in
one process or group, for reference runs (tests, the torchrun baselines of the benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from unicron.shared.contracts.models import JobSpec
from unicron.trainer.data import micro_batch
from unicron.trainer.model import GPT, build_model
from unicron.trainer.parallel import drive, new_work
from unicron.trainer.parallel import train_step as step_generator
from unicron.trainer.run import Run

# Fixed by design: the reference trainer has no schedule so resumed runs need no extra state.
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 0.01

Batch = tuple[torch.Tensor, torch.Tensor]
# Called before every micro-batch's forward; raising from it fails the step as a fault would.
Hook = Callable[[Run, GPT], None]


def make_optimizer(model: GPT) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)


def source(spec: JobSpec) -> Callable[[int, int], Batch]:
    """Micro-batch ``index`` of ``step`` of the job's synthetic data."""
    return lambda step, index: micro_batch(spec.seed, step, index, spec.micro_batch, spec.model)


def train(run: Run, hook: Hook | None = None) -> None:
    """Train the job's GPT to its last step."""
    spec = run.spec
    model = build_model(spec.model, spec.seed, run.device)
    optimizer = make_optimizer(model)
    run.wrap(model, optimizer)
    for inputs, targets in run.batches(source(spec)):
        if hook is not None:
            hook(run, model)
        run.backward(model.loss(inputs, targets))


def train_step(
    model: GPT,
    optimizer: torch.optim.Optimizer,
    spec: JobSpec,
    step: int,
    rank: int,
    world: int,
    group: dist.ProcessGroup | None,
) -> float:
    """One step of ``rank``'s share of the global batch, all-reduced over ``group`` (None: a
    single process with the whole batch); returns the step's mean loss."""
    work = new_work(step, rank, world, spec.micro_batches)
    compute = loss_of(model, spec)
    steps = step_generator(model, optimizer, work, spec.micro_batches, group)
    return drive(steps, lambda index: compute(step, index), lambda: work)


def loss_of(model: GPT, spec: JobSpec) -> Callable[[int, int], torch.Tensor]:
    """``loss(step, index)``: the model's mean loss on that micro-batch, forward only."""
    data = source(spec)
    device = next(model.parameters()).device

    def loss(step: int, index: int) -> torch.Tensor:
        inputs, targets = data(step, index)
        return model.loss(inputs.to(device), targets.to(device))

    return loss
