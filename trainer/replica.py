"""A rank's training state in memory, the one thing a regroup must not lose.

The hand-off (:mod:`unicron.trainer.handoff`) moves it between ranks and the resume
(:mod:`unicron.trainer.resume`) refills it from a checkpoint; both take it from here, so
neither needs the other to name it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from unicron.trainer import checkpoint
from unicron.trainer.parallel import Scheduler, StepWork


@dataclass
class Replica:
    """This rank's training state in memory, kept across regroups."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    next_step: int
    has_state: bool  # False for a joiner until a peer (or the disk) gives it the state
    work: StepWork | None = None
    scheduler: Scheduler | None = None

    def capture(self, step: int) -> checkpoint.TrainState:
        return checkpoint.capture(self.model, self.optimizer, step, self.scheduler)

    def restore(self, state: checkpoint.TrainState) -> int:
        return checkpoint.restore(self.model, self.optimizer, state, self.scheduler)
