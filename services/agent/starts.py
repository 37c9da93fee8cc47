"""Where a worker's process comes from: a warm spare, or else a fresh interpreter.

The supervisor (:mod:`unicron.services.agent.supervisor`) decides which workers run; this module
makes one start's process. A start takes its GPU slot first (a spare holds none until its launch
names it), then claims a warm spare (:mod:`unicron.services.agent.spares`): a connected one takes
the launch at once, and one still warming up is waited for, bounded by how long a fresh
interpreter takes now, since a fresh process would repeat the import the spare is already part
way through. The start spawns a fresh process only when it got no spare, when its spare died or
was late, or when a spare cannot run the launch (not a Python script or module). Which it was,
and how long it waited on a warming spare, goes into the worker's ``WorkerStarted`` (``warm``,
``spare_wait_s``): what a recovery's joiner waited on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from unicron.services.agent.api import Sink, SpareSource
from unicron.services.agent.failures import cannot_execute, launch_failure
from unicron.services.agent.gpus import SlotPool
from unicron.services.agent.launch import (
    JobContext,
    ProcessLaunch,
    process_launch,
    spare_can_run,
    spawn_logged,
    worker_launch,
)
from unicron.services.agent.registry import EntrypointRegistry
from unicron.services.agent.workers import SpareClaim, WorkerKey
from unicron.shared.contracts.messages import StartWorker
from unicron.shared.contracts.workerchannel import ScriptLaunch, SpareLaunch
from unicron.shared.logging import get_logger
from unicron.shared.procs import die_with_parent

log = get_logger(component="starts")
WorkerPath = Callable[[WorkerKey], Path]


@dataclass(eq=False)
class Start:
    """One start, settled before it waits for anything: its process, slot and spare."""

    cmd: StartWorker
    ctx: JobContext
    process: ProcessLaunch
    slot: int | None
    spare: SpareClaim | None
    # Its slot and spare are its own to give back, until a process has them: a start cancelled
    # before its task ever ran must give them back too, and none may go back twice.
    holds: bool = True

    @property
    def waits(self) -> bool:
        """Whether its spare is still warming up, so that the start waits for it."""
        return self.spare is not None and not self.spare.ready


class Launched(NamedTuple):
    proc: asyncio.subprocess.Process
    warm: bool  # a spare became the worker: no fresh interpreter was started
    spare_wait_s: float  # spent waiting for a spare still warming up


class Launcher:
    def __init__(
        self,
        node_id: str,
        socket_path: Path,
        registry: EntrypointRegistry,
        slots: SlotPool,
        sink: Sink,
        log_path: WorkerPath,
        error_path: WorkerPath,
        spares: SpareSource | None = None,
    ) -> None:
        self.node_id = node_id
        self.socket_path = socket_path
        self.registry = registry
        self.slots = slots
        self.sink = sink
        self.log_path = log_path
        self.error_path = error_path  # the worker's TORCHELASTIC_ERROR_FILE
        self.spares = spares  # warm spares that serve starts, when enabled

    def prepare(self, cmd: StartWorker, ctx: JobContext) -> Start:
        """Take the start's slot (``NoFreeGPUError`` when none is free) and claim its spare."""
        slot = self.slots.acquire()
        try:
            process = process_launch(
                cmd, ctx, node_id=self.node_id, socket=self.socket_path, registry=self.registry,
                slot_env=self.slots.env(slot), error_file=self.error_path(cmd.key),
            )  # fmt: skip
        except BaseException:
            self.slots.release(slot)
            raise
        spare = None
        if self.spares is not None and spare_can_run(process.argv):
            spare = self.spares.claim()
        return Start(cmd, ctx, process, slot, spare)

    async def launch(self, start: Start) -> Launched | None:
        """The start's process: its spare, once that took the launch, else a fresh one; None
        when the command cannot be executed (reported as such). Unless a process got the slot
        (and a spare its launch), both are given back, also when the start is cancelled."""
        began = time.monotonic()
        try:
            proc = await self._from_spare(start)
            waited = time.monotonic() - began if start.waits else 0.0
            warm = proc is not None
            if proc is None:
                proc = await self._spawn(start)
        except BaseException:
            self.give_back(start)
            raise
        if proc is None:  # it cannot be executed: reported as such
            self.give_back(start)
            return None
        start.holds = False  # the worker's now
        return Launched(proc, warm, waited)

    def give_back(self, start: Start) -> None:
        """Release the start's slot and kill its spare, unless a worker has them."""
        if not start.holds:
            return
        start.holds = False
        self.slots.release(start.slot)
        if start.spare is not None and self.spares is not None:
            self.spares.drop(start.spare)

    async def _from_spare(self, start: Start) -> asyncio.subprocess.Process | None:
        """The spare as the worker, sent the process a spawn would start (so it runs the job's
        own trainer or entrypoint); None when the start holds no spare or it did not take it."""
        if start.spare is None or self.spares is None:
            return None
        cmd = start.cmd
        argv, env, cwd = start.process
        script = ScriptLaunch(argv=argv, env=env, cwd=None if cwd is None else str(cwd))
        launch = worker_launch(cmd, start.ctx, self.node_id, self.socket_path)
        spare_launch = SpareLaunch(launch=launch, script=script)
        return await self.spares.take(start.spare, cmd.key, spare_launch, self.log_path(cmd.key))

    async def _spawn(self, start: Start) -> asyncio.subprocess.Process | None:
        cmd = start.cmd
        argv, env, cwd = start.process
        try:
            return await spawn_logged(argv, env, self.log_path(cmd.key), die_with_parent, cwd)
        except OSError as exc:
            if not cannot_execute(exc):
                raise
            for report in launch_failure(self.node_id, cmd, argv, cwd, exc):
                self.sink.report(report)
            log.error("worker could not be started", job_id=cmd.job_id, rank=cmd.rank, error=exc)
            return None
