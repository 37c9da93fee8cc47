"""One training step of a rank as the runtime runs it, and the monitor that watches it.

:func:`step_micro_batches` is a rank's step: :func:`unicron.trainer.parallel.train_step` plus the
sample ledger, the step report and the node's checkpoint (one rank per node writes it,
:mod:`unicron.trainer.storage`). It yields micro-batch indices and the caller does each forward and
backward (the user's loop body, through :mod:`unicron.train`); :func:`run_step` drives it
with the trainee's own loss function, which is how the overhead benchmark runs the same step
with a :class:`StepMonitor` and bare (``monitor=None``) to measure what monitoring costs.

The monitor is the worker's in-band telemetry (docs/design.md §3):

- ``WorkerPhase`` when the step enters its own compute, enters the all-reduce, and when this
  rank starts writing a checkpoint — a rank that stops making progress in *compute* is the
  culprit, its peers that stop in the *collective* are only waiting for it;
- ``StepCompleted`` with ``compute_s``, this rank's forward/backward time before the
  all-reduce; the all-reduce evens out iteration times, so only this shows a straggler;
- fault directives from the agent, checked once per step at the start of compute.

Everything goes through the channel's non-blocking queue: training never waits on the agent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
import torch.distributed as dist
from torch import nn
from unicron.shared.contracts.identity import Who, who
from unicron.shared.contracts.reports import StepCompleted, WorkerPhase
from unicron.shared.contracts.workerchannel import WorkerLaunch
from unicron.trainer import checkpoint
from unicron.trainer.channel import Deferred, Report
from unicron.trainer.faults import FaultInbox, FaultInjector
from unicron.trainer.ledger import Ledger, LedgerEntry
from unicron.trainer.parallel import Scheduler, StepGenerator, StepWork, drive, new_work, train_step
from unicron.trainer.storage import CheckpointStore

Phase = Literal["compute", "collective", "checkpoint"]


class Channel(Protocol):
    """Where a rank's reports go: the agent's :class:`~unicron.trainer.channel.AgentChannel`, or
    nowhere for a script run outside Unicron."""

    def send(self, report: Report) -> None: ...

    def flush(self, timeout_s: float) -> bool: ...

    def close(self) -> None: ...


# The mean loss of micro-batch ``index`` of ``step``, forward only: what drives a step closed.
MicroBatchLoss = Callable[[int, int], torch.Tensor]


@dataclass
class Trainee:
    """What one rank trains: everything a step needs besides its number.

    ``work`` is the step in progress (kept when its collective fails, so that a regroup can
    reuse it), ``interrupted`` is asked between micro-batches whether a regroup is waiting,
    ``ledger`` records which micro-batches each completed step used, and ``compute`` is the
    loss function :func:`run_step` drives the step with (a user's loop body needs none).
    ``checkpoints`` is where its checkpoints go (by default its node's directory alone).
    """

    launch: WorkerLaunch
    model: nn.Module
    optimizer: torch.optim.Optimizer
    group: dist.ProcessGroup | None
    work: StepWork | None = None
    interrupted: Callable[[], bool] | None = None
    ledger: Ledger | None = None
    scheduler: Scheduler | None = None
    compute: MicroBatchLoss | None = None
    checkpoints: CheckpointStore | None = None

    def store(self) -> CheckpointStore:
        if self.checkpoints is None:
            self.checkpoints = CheckpointStore(self.launch.checkpoint_dir)
        return self.checkpoints

    def backward(self, loss: torch.Tensor) -> None:
        """Sum the gradient of the micro-batch just handed out (see ``StepWork.add``)."""
        if self.work is None:
            raise RuntimeError("backward() outside a step: call it inside the batches() loop")
        self.work.add(loss)


class StepMonitor:
    """Phases, compute timing, step reports and fault drills of one rank (see module doc)."""

    def __init__(
        self,
        launch: WorkerLaunch,
        channel: Channel,
        inbox: FaultInbox,
        resumed_from: int | None = None,
        device: torch.device | None = None,
    ) -> None:
        self._who = who(launch.node_id, launch.key)
        self._channel = channel
        self._inbox = inbox
        self._injector = FaultInjector()
        self._resumed_from = resumed_from
        self._compute_began = 0.0
        # CUDA kernels run behind the host: without a sync the clock would stop when the
        # kernels are queued, and a rank stuck in a kernel would already claim "collective".
        # One sync per step, just before the all-reduce that must wait for them anyway.
        self._cuda = device is not None and device.type == "cuda"
        self.compute_s = 0.0
        # True while this rank waits in the step's all-reduce: a failure there is a peer's.
        self.in_collective = False

    def before_compute(self, step: int) -> None:
        self.phase("compute", step)
        self._compute_began = time.perf_counter()
        # After the phase report, so a rank that hangs here is seen hanging in compute.
        for fault in self._inbox.due(step):
            self._injector.fire(fault, step)

    def before_collective(self, step: int) -> None:
        if self._cuda:
            torch.cuda.synchronize()
        compute_s = time.perf_counter() - self._compute_began
        slowdown = self._injector.slowdown
        if slowdown > 1.0:
            # A slow rank: stretch this step's own compute to ``slowdown`` times its length.
            time.sleep(compute_s * (slowdown - 1.0))
            compute_s = time.perf_counter() - self._compute_began
        self.compute_s = compute_s
        self.phase("collective", step)
        self.in_collective = True

    def after_collective(self, step: int) -> None:
        self.in_collective = False

    def phase(self, phase: Phase, step: int) -> None:
        self._channel.send(Deferred(_phase_report, self._who, time.time(), phase, step))

    def completed(self, step: int, loss: float, iteration_s: float) -> None:
        values = (step, loss, iteration_s, self.compute_s, self._resumed_from)
        self._channel.send(Deferred(_step_report, self._who, time.time(), *values))
        self._resumed_from = None  # only the first step after a resume says where it began


# The models themselves, built on the channel's writer thread (see ``Deferred``).


def _phase_report(who: Who, at: float, phase: Phase, step: int) -> WorkerPhase:
    return WorkerPhase(**who, at=at, phase=phase, step=step)


def _step_report(
    who: Who,
    at: float,
    step: int,
    loss: float,
    iteration_s: float,
    compute_s: float,
    resumed_from: int | None,
) -> StepCompleted:
    return StepCompleted(
        **who,
        at=at,
        step=step,
        loss=loss,
        iteration_s=iteration_s,
        compute_s=compute_s,
        resumed_from=resumed_from,
    )


def step_micro_batches(
    trainee: Trainee, step: int, monitor: StepMonitor | None
) -> StepGenerator[int]:
    """Train ``step`` and write the node's checkpoint when due and this rank claims it; yields
    the micro-batch indices whose loss the caller hands to ``trainee.backward`` and returns
    the step's mean loss.

    With ``monitor=None`` the step is bare: no timing, no phases, no reports, no drills.
    """
    launch = trainee.launch
    spec = launch.spec
    began = time.perf_counter() if monitor is not None else 0.0
    work = trainee.work
    if work is None or work.step != step:
        work = trainee.work = new_work(step, launch.rank, launch.world_size, spec.micro_batches)
    store = trainee.store()
    claimed = store.claim_before_step(launch, step)
    loss = yield from train_step(
        trainee.model,
        trainee.optimizer,
        work,
        spec.micro_batches,
        trainee.group,
        monitor,
        trainee.interrupted,
        trainee.scheduler,
    )
    trainee.work = None
    if trainee.ledger is not None and work.counted is not None:
        entry = LedgerEntry(
            step, launch.generation, launch.world_size, launch.rank, work.done, work.counted
        )
        trainee.ledger.record(entry)
    if monitor is not None:
        monitor.completed(step, loss, time.perf_counter() - began)
    if store.claim_after_step(launch, step, claimed):
        if monitor is not None:
            monitor.phase("checkpoint", step)
        state = checkpoint.capture(trainee.model, trainee.optimizer, step, trainee.scheduler)
        store.write(launch, step, state)
    return loss


def run_step(trainee: Trainee, step: int, monitor: StepMonitor | None) -> float:
    """:func:`step_micro_batches` driven by ``trainee.compute``; returns the step's mean loss."""
    compute = trainee.compute
    if compute is None:
        raise ValueError("run_step needs a trainee with a compute (micro-batch loss) function")

    def work() -> StepWork:
        assert trainee.work is not None  # the generator made it before its first yield
        return trainee.work

    return drive(step_micro_batches(trainee, step, monitor), lambda i: compute(step, i), work)
