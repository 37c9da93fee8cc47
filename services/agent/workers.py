"""A worker as its agent knows it: the key it was launched under, its process and its state.

Shared by the supervisor, which launches and reaps workers, and by the parts that act on live
ones (hang detection, faults, regroups, warm spares).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from unicron.shared.contracts.identity import WorkerKey as WorkerKey

Generation = tuple[str, int]  # (job id, generation)


class CommandRejectedError(ValueError):
    """A command that can never succeed on this node; it is dead-lettered, not retried."""


@dataclass
class Worker:
    key: WorkerKey
    proc: asyncio.subprocess.Process
    generation: int  # the launch generation, raised when the worker re-forms in place
    slot: int | None = None  # its GPU slot, on a node with GPUs
    rank: int | None = None  # its rank now, when a regroup gave it a new one
    spare: bool = False  # a warm spare took the launch instead of a fresh process
    plain: bool = False  # the job's own entrypoint: it may never report a step
    last_step: int | None = None  # the job's last step: past it the worker is finishing
    reported: bool = False  # it sent its own WorkerException over the channel
    started_at: float = field(default_factory=time.monotonic)
    stopping: bool = False
    waiter: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    @property
    def current(self) -> WorkerKey:
        """Who the worker is now: its launch key with the generation (and rank) it re-formed
        into."""
        rank = self.key.rank if self.rank is None else self.rank
        return self.key._replace(generation=self.generation, rank=rank)


class SpareClaim(NamedTuple):
    """A warm spare that one start holds, so that no other start can take it."""

    spare: WorkerKey  # the spare's own key on the channel
    ready: bool  # connected when claimed; else still warming up, and the start waits for it


def kill_group(pid: int) -> None:
    """SIGKILL the worker's process group (it leads its own session), or at least itself."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone: its waiter reports the exit
    except PermissionError:
        os.kill(pid, signal.SIGKILL)
