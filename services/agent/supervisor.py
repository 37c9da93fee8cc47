"""Launches this node's worker processes and reports every start and exit at once.

A worker is one rank of one generation of a job: the process :mod:`unicron.services.agent.launch`
describes (the reference trainer, or the job's own entrypoint). Each worker has a task blocked
in ``proc.wait()``, so its exit is reported the moment the kernel reaps it, not at a poll,
once the channel has read what it sent last (its last steps come before its exit).
Workers run in their own process group (a stop kills helpers they forked too) and get SIGKILL
when the agent dies, so none outlives the agent. On a node with GPUs each worker gets a device
of its own (``unicron.services.agent.gpus``), and a start that finds none free is refused as a
failed launch of that rank, never given a shared one. Where a start's process comes from, a warm
spare or a fresh interpreter, is :mod:`unicron.services.agent.starts`; a start that waits for a
spare still warming up goes on in the background, so the node's other commands do not queue
behind it, and a stop of its generation (or the agent's shutdown) cancels it. A worker that
exits non-zero without having reported an exception in-band (a plain script) gets one read from
its torchelastic error file or its log (:mod:`unicron.services.agent.failures`), and a command
that cannot be executed at all is reported as a launch failure: no retry helps.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

from unicron.services.agent.api import Drained, Report, Sink, SpareSource
from unicron.services.agent.failures import exit_exception, no_free_gpu
from unicron.services.agent.gpus import NoFreeGPUError, SlotPool
from unicron.services.agent.launch import JobContext
from unicron.services.agent.registry import EntrypointRegistry
from unicron.services.agent.starts import Launched, Launcher, Start
from unicron.services.agent.workers import CommandRejectedError as CommandRejectedError
from unicron.services.agent.workers import Worker as Worker
from unicron.services.agent.workers import WorkerKey as WorkerKey
from unicron.services.agent.workers import kill_group
from unicron.shared.contracts.messages import StartWorker, StopWorkers
from unicron.shared.contracts.reports import WorkerException, WorkerExited, WorkerStarted
from unicron.shared.logging import get_logger
from unicron.shared.tasks import cancel_and_wait

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
        self.launcher = Launcher(
            node_id, socket_path, registry, self.slots, sink, self.log_path, self.error_path, spares
        )
        self.drained = drained
        self.closing = False
        self._workers: dict[WorkerKey, Worker] = {}
        self._starting: dict[WorkerKey, asyncio.Task[None]] = {}  # waiting for a warming spare
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
        if key in self._workers or key in self._starting or self.find(key) is not None:
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
        if ctx.spec.entrypoint is None and ctx.spec.trainer not in self.registry.names():
            raise CommandRejectedError(f"trainer {ctx.spec.trainer!r} is not registered")
        self.error_path(key).unlink(missing_ok=True)  # only this launch's exception may be read
        try:
            start = self.launcher.prepare(cmd, ctx)
        except NoFreeGPUError:  # never a shared device: NCCL refuses two ranks on one GPU
            held = [w.current for w in self.live() if w.slot is not None]
            for report in no_free_gpu(self.node_id, cmd, self.slots.describe(), held):
                self.sink.report(report)
            log.error("worker cannot start: no free GPU", **key._asdict(), held=len(held))
            return
        if not start.waits:
            await self._launch(start)
            return
        task = asyncio.create_task(self._launch_later(start), name=f"start-{key}")
        self._starting[key] = task
        task.add_done_callback(lambda _task: self._started_or_cancelled(start))

    def _started_or_cancelled(self, start: Start) -> None:
        self._starting.pop(start.cmd.key, None)
        self.launcher.give_back(start)  # a start cancelled before its task ever ran

    async def _launch(self, start: Start) -> None:
        launched = await self.launcher.launch(start)
        if launched is None:
            return  # it could not be executed; reported as such
        cmd, spec = start.cmd, start.ctx.spec
        plain = spec.entrypoint is not None
        worker = Worker(
            cmd.key, launched.proc, cmd.generation, start.slot, spare=launched.warm, plain=plain,
            last_step=spec.steps,
        )  # fmt: skip
        self._workers[cmd.key] = worker
        worker.waiter = asyncio.create_task(self._watch(worker), name=f"watch-{cmd.key}")
        self.sink.report(self._started(worker, launched))
        log.info(
            "worker started", **cmd.key._asdict(), pid=worker.proc.pid, slot=worker.slot,
            warm=launched.warm, spare_wait_s=round(launched.spare_wait_s, 3),
        )  # fmt: skip

    async def _launch_later(self, start: Start) -> None:
        """A start that waits for a warming spare, off the command's handler. It was acked, so
        nothing retries it: a failure is reported as the rank's exit, for the job to recover."""
        try:
            await self._launch(start)
        except Exception:
            cmd = start.cmd
            log.exception("worker could not be started", **cmd.key._asdict())
            self.sink.report(
                WorkerExited(node_id=self.node_id, **cmd.key._asdict(), pid=0, exit_code=1)
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
        await self._cancel_starts(
            lambda key: (
                key.job_id == cmd.job_id
                and (cmd.below_generation is None or key.generation < cmd.below_generation)
            )
        )
        await self._kill_and_wait(victims, wait_s)

    async def stop_all(self, wait_s: float = 5.0) -> int:
        """SIGKILL every live worker, as a stop does (their exits say the agent stopped them);
        returns how many. New starts are still taken."""
        victims = self.live()
        await self._cancel_starts(lambda _key: True)
        await self._kill_and_wait(victims, wait_s)
        return len(victims)

    def crash(self, worker: Worker) -> None:
        """SIGKILL a worker as a fault would: its exit is reported as a crash, not a stop."""
        log.warning("crashing worker on request", job_id=worker.key.job_id, pid=worker.proc.pid)
        kill_group(worker.proc.pid)

    async def shutdown(self, wait_s: float = 5.0) -> None:
        """Refuse new workers, kill the live ones and wait until each exit is reported."""
        self.closing = True
        await self._cancel_starts(lambda _key: True)
        await self._kill_and_wait(self.live(), wait_s)

    # --- processes ---------------------------------------------------------------------

    def log_path(self, key: WorkerKey) -> Path:
        return self.data_dir / "logs" / key.job_id / f"g{key.generation}-r{key.rank}.log"

    def error_path(self, key: WorkerKey) -> Path:
        """Its ``TORCHELASTIC_ERROR_FILE``, beside its log."""
        return self.log_path(key).with_suffix(".error.json")

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

    async def _cancel_starts(self, which: Callable[[WorkerKey], bool]) -> None:
        """Cancel the starts still waiting for a spare: their slots and spares go back."""
        doomed = [task for key, task in self._starting.items() if which(key)]
        await cancel_and_wait(doomed, what="starts waiting for a spare")

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

    def _started(self, worker: Worker, launched: Launched) -> WorkerStarted:
        return WorkerStarted(
            node_id=self.node_id, **worker.key._asdict(), pid=worker.proc.pid,
            warm=launched.warm, spare_wait_s=launched.spare_wait_s,
        )  # fmt: skip
