"""Launches this node's worker processes and reports every start and exit at once.

A worker is one rank of one generation of a job, launched as ``python -m <registered module>``
with its ``WorkerLaunch`` in ``UNICRON_WORKER_LAUNCH``. Each worker has a task blocked in
``proc.wait()``, so its exit is reported the moment the kernel reaps it, not at a poll. Workers
run in their own process group (a stop kills helpers they forked too) and get SIGKILL when the
agent dies, so none outlives the agent. On a node with GPUs each worker gets a device of its
own (``services.agent.gpus``).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from unicron.services.agent.gpus import SlotPool
from unicron.services.agent.outbox import Sink
from unicron.services.agent.registry import EntrypointRegistry, UnknownTrainerError
from unicron.shared.logging import get_logger
from unicron.shared.messages import StartWorker, StopWorkers, WorkerLaunch
from unicron.shared.procs import die_with_parent
from unicron.shared.reports import WorkerExited, WorkerStarted

if TYPE_CHECKING:
    from unicron.services.agent.spares import SparePool

log = get_logger(component="supervisor")
# job ids become directory names: refuse anything that could climb out of the log directory.
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class WorkerKey(NamedTuple):
    job_id: str
    generation: int
    rank: int


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


class Supervisor:
    def __init__(
        self,
        node_id: str,
        data_dir: Path,
        registry: EntrypointRegistry,
        socket_path: Path,
        sink: Sink,
    ) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.registry = registry
        self.socket_path = socket_path
        self.sink = sink
        self.slots = SlotPool()  # the agent gives it the node's devices once it found them
        self.spares: SparePool | None = None  # warm spares that serve starts, when enabled
        self.closing = False
        self._workers: dict[WorkerKey, Worker] = {}
        self._stopped_below: dict[str, int] = {}  # job → generations below this were stopped

    # --- queries -----------------------------------------------------------------------

    def live(self) -> list[Worker]:
        return [w for w in self._workers.values() if w.alive]

    def identify(self, pid: int) -> WorkerKey | None:
        """Which worker this process is, if the agent launched it."""
        return next((w.key for w in self.live() if w.proc.pid == pid), None)

    def find(self, key: WorkerKey) -> Worker | None:
        """The live worker re-formed into ``key``, or else the one launched as it."""
        live = self.live()
        now_is = next((w for w in live if w.current == key), None)
        return now_is or next((w for w in live if w.key == key), None)

    def regroup(self, worker: Worker, generation: int, rank: int) -> None:
        """The worker is told to re-form as ``rank`` of ``generation``: from now on stops, faults,
        hang reports and its exit report know it by that identity."""
        worker.generation = max(worker.generation, generation)
        worker.rank = rank

    def advance(self, key: WorkerKey, generation: int) -> None:
        """The worker joined a newer generation in place: a stop of older ones must spare it."""
        worker = self._workers.get(key)
        if worker is not None and generation > worker.generation:
            worker.generation = generation

    # --- commands ----------------------------------------------------------------------

    async def start_worker(self, cmd: StartWorker) -> None:
        """Launch the worker unless it is already known (live or finished) or stale."""
        key = WorkerKey(cmd.job_id, cmd.generation, cmd.rank)
        wlog = log.bind(job_id=cmd.job_id, generation=cmd.generation, rank=cmd.rank)
        if self.closing:
            raise RuntimeError("agent is shutting down")  # not acked: the next boot gets it
        if key in self._workers or self.find(key) is not None:
            wlog.info("duplicate start ignored")
            return
        if cmd.generation < self._stopped_below.get(cmd.job_id, 0):
            wlog.info("start for a stopped generation ignored")
            return
        if not _SAFE_ID.match(cmd.job_id):
            raise CommandRejectedError(f"job id {cmd.job_id!r} is not a safe name")
        try:
            argv = self.registry.argv(cmd.spec.trainer)
        except UnknownTrainerError as exc:
            raise CommandRejectedError(str(exc)) from None
        worker = await self._from_spare(key, cmd, argv) or await self._spawn(key, cmd, argv)
        self._workers[key] = worker
        worker.waiter = asyncio.create_task(self._watch(worker), name=f"watch-{key}")
        self.sink.report(self._started(worker))
        wlog.info(
            "worker started", pid=worker.proc.pid, argv=argv, slot=worker.slot, spare=worker.spare
        )

    async def stop_workers(self, cmd: StopWorkers, wait_s: float = 5.0) -> None:
        """SIGKILL the job's live workers below the generation and wait for them to be reaped."""
        if cmd.below_generation is not None:
            floor = max(self._stopped_below.get(cmd.job_id, 0), cmd.below_generation)
            self._stopped_below[cmd.job_id] = floor
        victims = [
            w
            for w in self.live()
            if w.key.job_id == cmd.job_id
            and (cmd.below_generation is None or w.generation < cmd.below_generation)
        ]
        log.info("stopping workers", job_id=cmd.job_id, count=len(victims), reason=cmd.reason)
        await self._kill_and_wait(victims, wait_s)

    def crash(self, worker: Worker) -> None:
        """SIGKILL a worker as a fault would: its exit is reported as a crash, not a stop."""
        log.warning("crashing worker on request", job_id=worker.key.job_id, pid=worker.proc.pid)
        kill_group(worker.proc.pid)

    async def shutdown(self, wait_s: float = 5.0) -> None:
        """Refuse new workers, kill the live ones and wait until each exit is reported."""
        self.closing = True
        await self._kill_and_wait(self.live(), wait_s)

    # --- processes ---------------------------------------------------------------------

    def log_path(self, key: WorkerKey) -> Path:
        return self.data_dir / "logs" / key.job_id / f"g{key.generation}-r{key.rank}.log"

    def _launch(self, cmd: StartWorker) -> WorkerLaunch:
        return WorkerLaunch(
            node_id=self.node_id,
            job_id=cmd.job_id,
            generation=cmd.generation,
            rank=cmd.rank,
            world_size=cmd.world_size,
            spec=cmd.spec,
            rendezvous=cmd.rendezvous,
            checkpoint_dir=cmd.checkpoint_dir,
            agent_socket=str(self.socket_path),
            state_source_rank=cmd.state_source_rank,
        )

    async def _from_spare(self, key: WorkerKey, cmd: StartWorker, argv: list[str]) -> Worker | None:
        """The worker as a warm spare that took the launch, or None when no spare is ready."""
        if self.spares is None or self.spares.argv != argv:
            return None
        served = await self.spares.serve(key, self._launch(cmd), self.log_path(key))
        if served is None:
            return None
        proc, slot = served
        return Worker(key, proc, cmd.generation, slot, spare=True)

    async def _spawn(self, key: WorkerKey, cmd: StartWorker, argv: list[str]) -> Worker:
        launch = self._launch(cmd)
        slot = self.slots.acquire()
        env = {
            **os.environ,
            **self.slots.env(slot),
            "UNICRON_WORKER_LAUNCH": launch.model_dump_json(),
        }
        path = self.log_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with path.open("ab") as out:  # the child keeps its own copy of the descriptor
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
        except BaseException:
            self.slots.release(slot)
            raise
        return Worker(key, proc, cmd.generation, slot)

    async def _watch(self, worker: Worker) -> None:
        """Report the exit the moment the process is reaped."""
        code = await worker.proc.wait()
        self.slots.release(worker.slot)
        if self.spares is not None and worker.slot is not None:
            self.spares.nudge()
        exit_code, sig = (None, -code) if code < 0 else (code, None)
        who = worker.current  # a worker that re-formed in place exits under its new identity
        self.sink.report(
            WorkerExited(
                node_id=self.node_id,
                job_id=who.job_id,
                generation=who.generation,
                rank=who.rank,
                pid=worker.proc.pid,
                exit_code=exit_code,
                signal=sig,
                stopped_by_agent=worker.stopping,
            )
        )
        log.info(
            "worker exited",
            job_id=who.job_id,
            generation=who.generation,
            rank=who.rank,
            exit_code=exit_code,
            signal=sig,
            stopped_by_agent=worker.stopping,
        )

    async def _kill_and_wait(self, victims: list[Worker], wait_s: float) -> None:
        for worker in victims:
            worker.stopping = True
            kill_group(worker.proc.pid)
        waiters = [w.waiter for w in victims if w.waiter is not None]
        if waiters:
            _done, pending = await asyncio.wait(waiters, timeout=wait_s)
            if pending:
                log.error("workers survived SIGKILL", count=len(pending))

    def _started(self, worker: Worker) -> WorkerStarted:
        key = worker.key
        return WorkerStarted(
            node_id=self.node_id,
            job_id=key.job_id,
            generation=key.generation,
            rank=key.rank,
            pid=worker.proc.pid,
        )


def kill_group(pid: int) -> None:
    """SIGKILL the worker's process group (it leads its own session), or at least itself."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # already gone: its waiter reports the exit
    except PermissionError:
        os.kill(pid, signal.SIGKILL)
