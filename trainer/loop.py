"""One training step of a rank as the runtime runs it, and the monitor that watches it.

:func:`run_step` is the single definition of a step: the runtime calls it with a
:class:`StepMonitor`, the overhead benchmark also calls it bare (``monitor=None``) to measure
what monitoring costs. The monitor is the worker's in-band telemetry (DESIGN.md §3):

- ``WorkerPhase`` when the step enters its own compute, enters the all-reduce, and when rank 0
  starts a checkpoint — a rank that stops making progress in *compute* is the culprit, its
  peers that stop in the *collective* are only waiting for it;
- ``StepCompleted`` with ``compute_s``, this rank's forward/backward time before the
  all-reduce; the all-reduce evens out iteration times, so only this shows a straggler;
- fault directives from the agent, checked once per step at the start of compute.

Everything goes through the channel's non-blocking queue: training never waits on the agent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from unicron.shared.messages import WorkerLaunch
from unicron.shared.reports import StepCompleted, WorkerPhase
from unicron.trainer import checkpoint
from unicron.trainer.channel import AgentChannel
from unicron.trainer.faults import FaultInbox, FaultInjector
from unicron.trainer.ledger import Ledger, LedgerEntry
from unicron.trainer.model import GPT
from unicron.trainer.parallel import StepWork, new_work, train_step

Phase = Literal["compute", "collective", "checkpoint"]


@dataclass
class Trainee:
    """What one rank trains: everything a step needs besides its number.

    ``work`` is the step in progress (kept when its collective fails, so that a regroup can
    reuse it), ``interrupted`` is asked between micro-batches whether a regroup is waiting,
    and ``ledger`` records which micro-batches each completed step used.
    """

    launch: WorkerLaunch
    model: GPT
    optimizer: torch.optim.Optimizer
    group: dist.ProcessGroup | None
    work: StepWork | None = None
    interrupted: Callable[[], bool] | None = None
    ledger: Ledger | None = None


class StepMonitor:
    """Phases, compute timing, step reports and fault drills of one rank (see module doc)."""

    def __init__(
        self,
        launch: WorkerLaunch,
        channel: AgentChannel,
        inbox: FaultInbox,
        resumed_from: int | None = None,
        device: torch.device | None = None,
    ) -> None:
        self._launch = launch
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
        launch = self._launch
        self._channel.send(
            WorkerPhase(
                node_id=launch.node_id,
                job_id=launch.job_id,
                generation=launch.generation,
                rank=launch.rank,
                phase=phase,
                step=step,
            )
        )

    def completed(self, step: int, loss: float, iteration_s: float) -> None:
        launch = self._launch
        self._channel.send(
            StepCompleted(
                node_id=launch.node_id,
                job_id=launch.job_id,
                generation=launch.generation,
                rank=launch.rank,
                step=step,
                loss=loss,
                iteration_s=iteration_s,
                compute_s=self.compute_s,
                resumed_from=self._resumed_from,
            )
        )
        self._resumed_from = None  # only the first step after a resume says where it began


def run_step(trainee: Trainee, step: int, monitor: StepMonitor | None) -> float:
    """Train ``step`` and, on rank 0, checkpoint when due; returns the step's mean loss.

    With ``monitor=None`` the step is bare: no timing, no phases, no reports, no drills.
    """
    launch = trainee.launch
    spec = launch.spec
    began = time.perf_counter() if monitor is not None else 0.0
    work = trainee.work
    if work is None or work.step != step:
        work = trainee.work = new_work(step, launch.rank, launch.world_size, spec.micro_batches)
    loss = train_step(
        trainee.model,
        trainee.optimizer,
        spec,
        step,
        launch.rank,
        launch.world_size,
        trainee.group,
        monitor,
        work,
        trainee.interrupted,
    )
    trainee.work = None
    if trainee.ledger is not None and work.counted is not None:
        entry = LedgerEntry(
            step, launch.generation, launch.world_size, launch.rank, work.done, work.counted
        )
        trainee.ledger.record(entry)
    if monitor is not None:
        monitor.completed(step, loss, time.perf_counter() - began)
    if launch.rank == 0 and (step % spec.checkpoint_every == 0 or step == spec.steps):
        if monitor is not None:
            monitor.phase("checkpoint", step)
        state = checkpoint.capture(trainee.model, trainee.optimizer, step)
        checkpoint.save(launch.checkpoint_dir, step, state)
    return loss
