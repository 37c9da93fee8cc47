"""The steps ``bench/overhead.py`` runs monitored and bare: the reference GPT, a user's own
model on the ``unicron.train`` data path (an MLP on a map-style dataset, read by
:func:`unicron.trainer.sampling.source_of`, sized for a ~0.1-s step like the GPT's), and the
reference step of docs/gpu-probe.md §9 (4 x (LayerNorm, Linear 2048→8192, GELU, Linear
8192→2048) in bf16 on 7168 tokens, ~10 ms on an H200; on a CPU a 2 x 128 float32 stack, as the
probe does). All use the runtime's step generator and ``StepMonitor``: the monitoring is the
same code, only the step it watches differs."""

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
# The reference step: (width, blocks, dtype) by device type, and its tokens, one micro-batch.
REFERENCE = {"cuda": (2048, 4, torch.bfloat16), "cpu": (128, 2, torch.float32)}
REFERENCE_TOKENS = 7168


@dataclass
class Variant:
    """A training step the bench runs monitored and bare: ``step(n, monitored)`` trains step
    ``n``; ``lines_per_step`` is how many lines a monitored step sends the agent."""

    step: Callable[[int, bool], None]
    lines_per_step: int
    hot_ns: Callable[[], int] = lambda: 0  # ns spent in monitoring calls so far, if it knows


class TimedMonitor(StepMonitor):
    """The runtime's monitor, clocking the time the training thread spends in its calls: the
    part of the overhead that load on the machine cannot blur.

    On CUDA the monitor synchronises before the all-reduce; the kernels it waits for are the
    step's own, which a bare step waits for in the all-reduce, so this clock starts after them.
    """

    spent_ns = 0

    def __init__(
        self, launch: WorkerLaunch, channel: AgentChannel, inbox: FaultInbox, device: torch.device
    ) -> None:
        super().__init__(launch, channel, inbox, device=device)
        self._sync = torch.cuda.synchronize if device.type == "cuda" else None

    def before_compute(self, step: int) -> None:
        began = time.perf_counter_ns()
        super().before_compute(step)
        self.spent_ns += time.perf_counter_ns() - began

    def before_collective(self, step: int) -> None:
        if self._sync is not None:
            self._sync()
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


@dataclass
class Setup:
    """What a variant is built from: the launch, the channel to the stand-in agent, the inbox
    its directives land in, the world-size-1 process group, and the device it trains on."""

    launch: WorkerLaunch
    channel: AgentChannel
    inbox: FaultInbox
    group: dist.ProcessGroup
    device: torch.device


VariantBuilder = Callable[[Setup], Variant]


def monitored_variant(setup: Setup, trainee: Trainee) -> Variant:
    """``trainee``'s step through the runtime's ``run_step``, with a ``TimedMonitor`` or bare;
    on CUDA a step ends when its kernels have, so that each step's time is its own."""
    monitor = TimedMonitor(trainee.launch, setup.channel, setup.inbox, setup.device)
    cuda = setup.device.type == "cuda"

    def step(n: int, monitored: bool) -> None:
        run_step(trainee, n, monitor if monitored else None)
        if cuda:
            torch.cuda.synchronize()

    # phase compute, phase collective, step completed
    return Variant(step, lines_per_step=3, hot_ns=lambda: monitor.spent_ns)


def gpt_variant(setup: Setup) -> Variant:
    """The runtime's own step (``unicron.trainer.loop.run_step``) with its ``StepMonitor``."""
    spec = setup.launch.spec
    model = build_model(spec.model, spec.seed, setup.device)
    compute = loss_of(model, spec)
    trainee = Trainee(setup.launch, model, make_optimizer(model), setup.group, compute=compute)
    return monitored_variant(setup, trainee)


def user_variant(setup: Setup) -> Variant:
    """A user's model and dataset through the API's data path and the runtime's step."""
    update = {"global_batch": USER_GLOBAL, "micro_batch": USER_MICRO}
    launch = with_spec(setup.launch, update)
    inputs = torch.randn(USER_SAMPLES, USER_FEATURES, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(inputs, (inputs.sum(dim=1) > 0).long())
    model = nn.Sequential(
        nn.Linear(USER_FEATURES, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 2),
    ).to(setup.device)  # fmt: skip
    fetch = source_of(data, launch.spec, setup.device)

    def loss(step: int, index: int) -> torch.Tensor:
        x, y = fetch(step, index)
        out: torch.Tensor = F.cross_entropy(model(x), y)
        return out

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return monitored_variant(setup, Trainee(launch, model, optimizer, setup.group, compute=loss))


def reference_variant(setup: Setup) -> Variant:
    """docs/gpu-probe.md's reference step: forward, backward and SGD of an MLP stack on one
    micro-batch of tokens, the loss the probe used."""
    launch = with_spec(setup.launch, {"global_batch": 1, "micro_batch": 1})
    width, blocks, dtype = REFERENCE["cuda" if setup.device.type == "cuda" else "cpu"]
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU()]
        layers.append(nn.Linear(4 * width, width))
    model = nn.Sequential(*layers).to(device=setup.device, dtype=dtype)
    tokens = torch.randn(REFERENCE_TOKENS, width, device=setup.device, dtype=dtype)

    def loss(step: int, index: int) -> torch.Tensor:
        out: torch.Tensor = model(tokens).float().pow(2).mean()
        return out

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    return monitored_variant(setup, Trainee(launch, model, optimizer, setup.group, compute=loss))


def with_spec(launch: WorkerLaunch, update: dict[str, int]) -> WorkerLaunch:
    return launch.model_copy(update={"spec": launch.spec.model_copy(update=update)})


VARIANTS: dict[str, VariantBuilder] = {
    "gpt": gpt_variant,
    "user": user_variant,
    "reference": reference_variant,
}
