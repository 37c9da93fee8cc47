"""Warm spares: pre-started worker processes (interpreter up, torch imported) waiting on the
local channel for a launch, so a replacement rank starts in milliseconds instead of the ~2 s
of a fresh Python + torch (docs/design.md §5).

A spare is ``python -m unicron.trainer.spare`` (the agent's ``spare_module``) with
``UNICRON_AGENT_SOCKET`` and ``UNICRON_WORKER_SPARE=1`` set; it connects to the agent's channel
and waits for one ``SpareLaunch`` line, which names what to run: the job's registered trainer
module or its own Python script or module, with its environment, run in the spare's own
process. A spare is tied to no trainer and no device, so any job's start can take one: it gets
its slot (``CUDA_VISIBLE_DEVICES``) with the launch, before its script touches CUDA. The pool
keeps ``count`` of them (by default one per slot, so every rank of a restarted generation can
start warm); a ``StartWorker`` takes a connected one (the supervisor then watches it as the
worker it became) and the pool starts another in the background. A spare that dies is
replaced; one that dies before it ever connected counts as a failed start, and after
``MAX_FAILED_STARTS`` of those in a row (a spare module that cannot wait) the pool gives up, so
every start falls back to spawning. Spares are never workers: they hold no rank, are not in the
node's ``used`` count, and are killed when the agent stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from unicron.services.agent.api import LaunchFor, WorkerLink
from unicron.services.agent.gpus import SlotPool
from unicron.services.agent.launch import spawn_logged
from unicron.services.agent.workers import kill_group
from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.workerchannel import WorkerEnv, env_name
from unicron.shared.logging import get_logger
from unicron.shared.procs import die_with_parent
from unicron.shared.servers.credentials import without_credentials
from unicron.shared.tasks import cancel_and_wait

log = get_logger(component="spares")
# A warming spare (importing torch) must not slow the node's workers: it runs at this niceness
# until it takes a launch, when the agent puts its whole process group back at 0.
SPARE_NICE = 10
SPARE_JOB = "~spare"  # a job id no real job can have (they start with a letter or digit)
MAX_FAILED_STARTS = 3


@dataclass
class Spare:
    key: WorkerKey
    proc: asyncio.subprocess.Process
    log_path: Path
    connected: bool = False
    taken: bool = False
    waiter: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


class SparePool:
    def __init__(
        self,
        count: int | None,
        argv: list[str],
        socket_path: Path,
        data_dir: Path,
        slots: SlotPool,
        channel: WorkerLink,
        delay_s: float = 0.0,
    ) -> None:
        self._count = count  # None: one per slot, known once the agent found its devices
        self.delay_s = delay_s  # after serving a start: leave the CPU to the transition first
        self._not_before = 0.0
        self.argv = argv
        self.socket_path = socket_path
        self.data_dir = data_dir
        self.slots = slots  # the node's devices: a spare takes one with its launch
        self.channel = channel
        self.served = 0
        self.failed_starts = 0
        self._spares: dict[int, Spare] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.nice = SPARE_NICE if _can_renice() else 0

    # --- queries -----------------------------------------------------------------------

    @property
    def count(self) -> int:
        """Spares to keep: by default one per slot, so every rank of a restarted generation
        starts warm."""
        return self.slots.count if self._count is None else self._count

    @property
    def enabled(self) -> bool:
        return self.count > 0 and self.failed_starts < MAX_FAILED_STARTS and not self._closing

    def waiting(self) -> list[Spare]:
        return [s for s in self._spares.values() if s.alive and not s.taken]

    def ready(self) -> list[Spare]:
        """Spares that are up and connected: a launch would reach them now."""
        return [s for s in self.waiting() if self.channel.connected(s.key)]

    def identify(self, pid: int) -> WorkerKey | None:
        """The spare with this process id (called when a process connects to the channel)."""
        for spare in self.waiting():
            if spare.proc.pid == pid:
                spare.connected = True
                self.failed_starts = 0
                return spare.key
        return None

    # --- life --------------------------------------------------------------------------

    def start(self) -> None:
        if self.count > 0:
            self._task = asyncio.create_task(self._keep(), name="spares")

    async def close(self, wait_s: float = 5.0) -> None:
        self._closing = True
        if self._task is not None:
            await cancel_and_wait([self._task], what="spare keeper")
        victims = self.waiting()
        for spare in victims:
            kill_group(spare.proc.pid)
        waiters = [s.waiter for s in victims if s.waiter is not None]
        if waiters:
            await asyncio.wait(waiters, timeout=wait_s)

    async def serve(
        self, key: WorkerKey, launch_for: LaunchFor, log_path: Path
    ) -> tuple[asyncio.subprocess.Process, int | None] | None:
        """Hand a ready spare the launch ``launch_for`` makes for its slot; its (process, slot),
        or None when none is ready or the launch is not one a spare can run."""
        if not self.enabled:
            return None
        for spare in self.ready():
            slot = self.slots.acquire()
            launch = launch_for(slot)
            if launch is None:
                self.slots.release(slot)
                return None
            spare.taken = True
            self._not_before = time.monotonic() + self.delay_s
            self._wake.set()  # start the next spare soon
            if not self._full_priority(spare):
                self._discard(spare, slot)
                continue
            # Adopted first: the worker it becomes may report before the send returns, and
            # those reports must already read as the job's, not the spare's.
            self.channel.adopt(spare.key, key)
            if not await self.channel.send_to_worker(spare.key, launch):
                log.warning("spare did not take its launch; killing it", pid=spare.proc.pid)
                self._discard(spare, slot)
                continue
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):  # the open descriptor follows the rename
                os.replace(spare.log_path, log_path)
            self.served += 1
            log.info("start served by a spare", job=key.job_id, rank=key.rank, pid=spare.proc.pid)
            return spare.proc, slot
        return None

    def _discard(self, spare: Spare, slot: int | None) -> None:
        """A taken spare that will not become the worker: kill it, give its slot back."""
        kill_group(spare.proc.pid)
        self.slots.release(slot)

    def _full_priority(self, spare: Spare) -> bool:
        """Put every thread of the spare back at niceness 0 before it becomes a worker."""
        if not self.nice:
            return True
        try:
            os.setpriority(os.PRIO_PGRP, spare.proc.pid, 0)  # all its threads, all its processes
        except OSError as exc:
            log.warning("cannot renice a spare; next spares start unniced", error=repr(exc))
            self.nice = 0
            return False
        return True

    async def _keep(self) -> None:
        """Keep ``count`` spares waiting; wakes when one is taken or dies."""
        while True:
            self._wake.clear()
            while self.enabled and len(self.waiting()) < self.count:
                pause = self._not_before - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
                    continue
                try:
                    await self._spawn()
                except Exception:
                    log.exception("could not start a spare")
                    self.failed_starts += 1
            await self._wake.wait()

    async def _spawn(self) -> None:
        index = next(self._ids)
        key = WorkerKey(SPARE_JOB, 0, index)
        path = self.data_dir / "logs" / "spares" / f"spare-{os.getpid()}-{index}.log"
        env = {
            **without_credentials(os.environ),  # a spare becomes the user's code: no logins
            # marked as a spare: how a scan of /proc tells one from a worker (bench/chaos_procs)
            **WorkerEnv(agent_socket=str(self.socket_path), spare=True).to_environ(),
        }
        env.pop(env_name("launch"), None)
        proc = await spawn_logged(self.argv, env, path, _preexec(self.nice))
        spare = Spare(key, proc, path)
        self._spares[index] = spare
        spare.waiter = asyncio.create_task(self._watch(spare), name=f"spare-{index}")
        log.info("spare started", pid=proc.pid)

    async def _watch(self, spare: Spare) -> None:
        code = await spare.proc.wait()
        if spare.taken:
            self._spares.pop(spare.key.rank, None)
            return  # the supervisor watches it as a worker now
        self._spares.pop(spare.key.rank, None)
        if self._closing:
            return
        if not spare.connected:
            self.failed_starts += 1
            if self.failed_starts >= MAX_FAILED_STARTS:
                log.error(
                    "spares keep dying before they connect; starts will spawn workers",
                    exit_code=code,
                    log=str(spare.log_path),
                )
        else:
            log.warning("spare died; replacing it", pid=spare.proc.pid, exit_code=code)
        self._wake.set()


def _can_renice() -> bool:
    """Whether this process may lower a niceness again (root, or RLIMIT_NICE allows it)."""
    if os.geteuid() == 0:
        return True
    soft, _hard = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or soft >= 20


def _preexec(nice: int) -> Callable[[], None]:
    def setup() -> None:
        die_with_parent()
        if nice:
            os.nice(nice)

    return setup
