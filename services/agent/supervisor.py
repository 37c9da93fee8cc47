"""Launches this node's worker processes and reports every start and exit at once.

A worker is one rank of one generation of a job: the process :mod:`unicron.services.agent.launch`
describes (the reference trainer, or the job's own entrypoint). Each worker has a task blocked
in ``proc.wait()``, so its exit is reported the moment the kernel reaps it, not at a poll,
once the channel has read what it sent last (its last steps come before its exit).
Workers run in their own process group (a stop kills helpers they forked too) and get SIGKILL
when the agent dies, so none outlives the agent. On a node with GPUs each worker gets a device
of its own (``unicron.services.agent.gpus``), and a start that finds none free is refused as a
failed launch of that rank, never given a shared one. A worker that exits non-zero without
having reported an exception in-band (a plain script) gets one read from its torchelastic error
file or its log (:mod:`unicron.services.agent.failures`), and a command that cannot be executed
at all is reported as a launch failure: no retry helps.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from unicron.services.agent.api import Drained, Report, Sink, SpareSource
from unicron.services.agent.failures import (
    cannot_execute,
    exit_exception,
    launch_failure,
    no_free_gpu,
)
from unicron.services.agent.gpus import NoFreeGPUError, SlotPool
from unicron.services.agent.launch import (
    JobContext,
    process_launch,
    spare_can_run,
    spawn_logged,
    worker_launch,
)
from unicron.services.agent.registry import EntrypointRegistry
from unicron.services.agent.workers import CommandRejectedError as CommandRejectedError
from unicron.services.agent.workers import Worker as Worker
from unicron.services.agent.workers import WorkerKey as WorkerKey
from unicron.services.agent.workers import kill_group
from unicron.shared.contracts.messages import StartWorker, StopWorkers
from unicron.shared.contracts.reports import WorkerException, WorkerExited, WorkerStarted
from unicron.shared.contracts.workerchannel import ScriptLaunch, SpareLaunch
from unicron.shared.logging import get_logger
from unicron.shared.procs import die_with_parent

log = get_logger(component="supervisor")
# job ids become directory names: refuse anything that could climb out of the log directory.
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# a worker's in-band report may still sit in the channel's socket when its exit is reaped
CHANNEL_GRACE_S = 0.1


class Supervisor:
    def __init__(
        self,
        node_id: str,
        data_dir: Path,
        registry: EntrypointRegistry,
        socket_path: Path,
        sink: Sink,
        slots: SlotPool | None = None,
        spares: SpareSource | None = None,
        drained: Drained | None = None,
    ) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.registry = registry
        self.socket_path = socket_path
        self.sink = sink
        # the agent learns the node's devices only once it runs: it fills the pool in then
        self.slots = SlotPool() if slots is None else slots
        self.spares = spares  # warm spares that serve starts, when enabled
        self.drained = drained
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

    def observe(self, launched: WorkerKey | None, report: Report) -> None:
        """Note a worker's in-band exception, so its exit is not classified a second time."""
        if isinstance(report, WorkerException):
            key = launched or report.key
            worker = self._workers.get(key) or self.find(key)
            if worker is not None:
                worker.reported = True

    # --- commands ----------------------------------------------------------------------

    def wanted(self, cmd: StartWorker) -> bool:
        """Whether ``cmd`` would launch a worker: not one already known, nor stale, nor unsafe."""
        key = cmd.key
        wlog = log.bind(**key._asdict())
        if self.closing:
            raise RuntimeError("agent is shutting down")  # not acked: the next boot gets it
        if key in self._workers or self.find(key) is not None:
            wlog.info("duplicate start ignored")
            return False
        if cmd.generation < self._stopped_below.get(cmd.job_id, 0):
            wlog.info("start for a stopped generation ignored")
            return False
        if not _SAFE_ID.match(cmd.job_id):
            raise CommandRejectedError(f"job id {cmd.job_id!r} is not a safe name")
        return True

    async def start_worker(self, cmd: StartWorker, ctx: JobContext) -> None:
        """Launch the worker of ``ctx`` (the job record's) unless it is known or stale."""
        if not self.wanted(cmd):
            return
        key = cmd.key
        wlog = log.bind(**key._asdict())
        if ctx.spec.entrypoint is None and ctx.spec.trainer not in self.registry.names():
            raise CommandRejectedError(f"trainer {ctx.spec.trainer!r} is not registered")
        self.error_path(key).unlink(missing_ok=True)  # only this launch's exception may be read
        try:
            spared = await self._from_spare(key, cmd, ctx)
            worker = spared or await self._spawn(key, cmd, ctx)
        except NoFreeGPUError:  # never a shared device: NCCL refuses two ranks on one GPU
            held = [w.current for w in self.live() if w.slot is not None]
            for report in no_free_gpu(self.node_id, cmd, self.slots.describe(), held):
                self.sink.report(report)
            wlog.error("worker cannot start: no free GPU", held=len(held))
            return
        if worker is None:
            return  # it could not be executed; reported as such
        self._workers[key] = worker
        worker.waiter = asyncio.create_task(self._watch(worker), name=f"watch-{key}")
        self.sink.report(self._started(worker))
        wlog.info("worker started", pid=worker.proc.pid, slot=worker.slot, spare=worker.spare)

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

    async def stop_all(self, wait_s: float = 5.0) -> int:
        """SIGKILL every live worker, as a stop does (their exits say the agent stopped them);
        returns how many. New starts are still taken."""
        victims = self.live()
        await self._kill_and_wait(victims, wait_s)
        return len(victims)

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

    def error_path(self, key: WorkerKey) -> Path:
        """Its ``TORCHELASTIC_ERROR_FILE``, beside its log."""
        return self.log_path(key).with_suffix(".error.json")

    async def _from_spare(self, key: WorkerKey, cmd: StartWorker, ctx: JobContext) -> Worker | None:
        """The worker as a warm spare that took the launch, or None when no spare is ready or
        a spare cannot run it (a command that is not a Python script or module). The spare is
        sent the process a spawn would start, so it runs the job's own trainer or entrypoint."""
        if self.spares is None:
            return None

        def launch_for(slot: int | None) -> SpareLaunch | None:
            argv, env, cwd = process_launch(
                cmd, ctx, node_id=self.node_id, socket=self.socket_path, registry=self.registry,
                slot_env=self.slots.env(slot), error_file=self.error_path(key),
            )  # fmt: skip
            if not spare_can_run(argv):
                return None
            launch = worker_launch(cmd, ctx, self.node_id, self.socket_path)
            cwd_text = None if cwd is None else str(cwd)
            return SpareLaunch(launch=launch, script=ScriptLaunch(argv=argv, env=env, cwd=cwd_text))

        served = await self.spares.serve(key, launch_for, self.log_path(key))
        if served is None:
            return None
        proc, slot = served
        plain = ctx.spec.entrypoint is not None
        return Worker(
            key, proc, cmd.generation, slot, spare=True, plain=plain, last_step=ctx.spec.steps
        )

    async def _spawn(self, key: WorkerKey, cmd: StartWorker, ctx: JobContext) -> Worker | None:
        slot = self.slots.acquire()
        argv, env, cwd = process_launch(
            cmd, ctx, node_id=self.node_id, socket=self.socket_path, registry=self.registry,
            slot_env=self.slots.env(slot), error_file=self.error_path(key),
        )  # fmt: skip
        try:
            proc = await spawn_logged(argv, env, self.log_path(key), die_with_parent, cwd)
        except OSError as exc:
            self.slots.release(slot)
            if not cannot_execute(exc):
                raise
            for report in launch_failure(self.node_id, cmd, argv, cwd, exc):
                self.sink.report(report)
            log.error("worker could not be started", job_id=cmd.job_id, rank=cmd.rank, error=exc)
            return None
        except BaseException:
            self.slots.release(slot)
            raise
        plain = ctx.spec.entrypoint is not None
        return Worker(key, proc, cmd.generation, slot, plain=plain, last_step=ctx.spec.steps)

    async def _watch(self, worker: Worker) -> None:
        """Report the exit the moment the process is reaped."""
        code = await worker.proc.wait()
        self.slots.release(worker.slot)
        if self.drained is not None:  # the kernel closed its socket: reading it costs no wait
            await self.drained(worker.proc.pid, CHANNEL_GRACE_S)
        exit_code, sig = (None, -code) if code < 0 else (code, None)
        who = worker.current  # a worker that re-formed in place exits under its new identity
        if code != 0 and not worker.stopping:
            await self._report_exit_exception(worker, sig)
        self.sink.report(
            WorkerExited(
                node_id=self.node_id,
                **who._asdict(),
                pid=worker.proc.pid,
                exit_code=exit_code,
                signal=sig,
                stopped_by_agent=worker.stopping,
            )
        )
        log.info(
            "worker exited",
            **who._asdict(),
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

    async def _report_exit_exception(self, worker: Worker, signum: int | None) -> None:
        """The exception a dead worker wrote down, unless it reported one itself."""
        files = (self.log_path(worker.key), self.error_path(worker.key))
        report = exit_exception(self.node_id, worker.current, worker.proc.pid, files, signum)
        if report is None:
            return
        if not worker.reported:
            self.sink.report(report)

    def _started(self, worker: Worker) -> WorkerStarted:
        return WorkerStarted(node_id=self.node_id, **worker.key._asdict(), pid=worker.proc.pid)
