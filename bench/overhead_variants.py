"""The steps ``bench/overhead.py`` runs monitored and bare: the reference GPT, and a user's own
model on the ``unicron.train`` data path (an MLP on a map-style dataset, read by
:func:`unicron.trainer.sampling.source_of`, sized for a ~0.1-s step like the GPT's). Both use the
runtime's step generator and ``StepMonitor``: the monitoring is the same code, only the
step it watches differs."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset
from unicron.shared.contracts.workerchannel import WorkerLaunch
from unicron.trainer.channel import AgentChannel
from unicron.trainer.faults import FaultInbox
from unicron.trainer.gpt import loss_of, make_optimizer
from unicron.trainer.loop import StepMonitor, Trainee, run_step
from unicron.trainer.model import build_model
from unicron.trainer.sampling import source_of

# The user variant: 4 micro-batches of 128 samples through a 1024-wide MLP, ~0.1 s a step.
USER_FEATURES, USER_SAMPLES, USER_MICRO, USER_GLOBAL = 1024, 4096, 128, 512


@dataclass
class Variant:
    """A training step the bench runs monitored and bare: ``step(n, monitored)`` trains step
    ``n``; ``lines_per_step`` is how many lines a monitored step sends the agent."""

    step: Callable[[int, bool], None]
    lines_per_step: int
    hot_ns: Callable[[], int] = lambda: 0  # ns spent in monitoring calls so far, if it knows


class TimedMonitor(StepMonitor):
    """The runtime's monitor, clocking the time the training thread spends in its calls: the
    part of the overhead that load on the machine cannot blur."""

    spent_ns = 0

    def before_compute(self, step: int) -> None:
        began = time.perf_counter_ns()
        super().before_compute(step)
        self.spent_ns += time.perf_counter_ns() - began

    def before_collective(self, step: int) -> None:
        began = time.perf_counter_ns()
        super().before_collective(step)
        self.spent_ns += time.perf_counter_ns() - began

    def after_collective(self, step: int) -> None:
        began = time.perf_counter_ns()
        super().after_collective(step)
        self.spent_ns += time.perf_counter_ns() - began

    def completed(self, step: int, loss: float, iteration_s: float) -> None:
        began = time.perf_counter_ns()
        super().completed(step, loss, iteration_s)
        self.spent_ns += time.perf_counter_ns() - began


# What a variant is built from: the launch, the channel to the stand-in agent, the inbox its
# directives land in, and the world-size-1 process group.
VariantBuilder = Callable[[WorkerLaunch, AgentChannel, FaultInbox, dist.ProcessGroup], Variant]


def gpt_variant(
    launch: WorkerLaunch, channel: AgentChannel, inbox: FaultInbox, group: dist.ProcessGroup
) -> Variant:
    """The runtime's own step (``unicron.trainer.loop.run_step``) with its ``StepMonitor``."""
    spec = launch.spec
    model = build_model(spec.model, spec.seed)
    trainee = Trainee(launch, model, make_optimizer(model), group, compute=loss_of(model, spec))
    monitor = TimedMonitor(launch, channel, inbox)

    def step(n: int, monitored: bool) -> None:
        run_step(trainee, n, monitor if monitored else None)

    # phase compute, phase collective, step completed
    return Variant(step, lines_per_step=3, hot_ns=lambda: monitor.spent_ns)


def user_variant(
    launch: WorkerLaunch, channel: AgentChannel, inbox: FaultInbox, group: dist.ProcessGroup
) -> Variant:
    """A user's model and dataset through the API's data path and the runtime's step."""
    spec = launch.spec.model_copy(update={"global_batch": USER_GLOBAL, "micro_batch": USER_MICRO})
    launch = launch.model_copy(update={"spec": spec})
    inputs = torch.randn(USER_SAMPLES, USER_FEATURES, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(inputs, (inputs.sum(dim=1) > 0).long())
    model = nn.Sequential(
        nn.Linear(USER_FEATURES, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 2),
    )  # fmt: skip
    fetch = source_of(data, spec, torch.device("cpu"))

    def loss(step: int, index: int) -> torch.Tensor:
        x, y = fetch(step, index)
        out: torch.Tensor = F.cross_entropy(model(x), y)
        return out

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainee = Trainee(launch, model, optimizer, group, compute=loss)
    monitor = TimedMonitor(launch, channel, inbox)

    def step(n: int, monitored: bool) -> None:
        run_step(trainee, n, monitor if monitored else None)

    return Variant(step, lines_per_step=3, hot_ns=lambda: monitor.spent_ns)


VARIANTS: dict[str, VariantBuilder] = {"gpt": gpt_variant, "user": user_variant}
