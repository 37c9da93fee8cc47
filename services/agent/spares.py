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
start warm); a ``StartWorker`` claims a connected one (the supervisor then watches it as the
worker it became) and the pool starts another in the background. With none connected, a start
claims the oldest one still warming up, at full priority, rather than start a fresh interpreter
that would repeat its whole import; it waits at most ``cold_start_s`` (the longest recent
warm-up: by then a fresh process would have been up), and a claimed spare that dies or is late
is killed. A claim is synchronous: two starts never hold one spare. A spare that dies is
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
from asyncio import FIRST_COMPLETED
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from unicron.services.agent.api import WorkerLink
from unicron.services.agent.gpus import SlotPool
from unicron.services.agent.launch import spawn_logged
from unicron.services.agent.workers import SpareClaim, kill_group
from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.workerchannel import SpareLaunch, WorkerEnv, env_name
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
# Until a spare has connected, how long a fresh Python + torch may take: a cold start took
# ~20 s on a loaded 2-core node (issue 31), and a start that gives up on its spare too early
# pays both the wait and the cold start.
FIRST_COLD_START_S = 30.0
WARMUPS_KEPT = 8  # recent warm-ups that say how slow a start is on this node now


@dataclass
class Spare:
    key: WorkerKey
    proc: asyncio.subprocess.Process
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)
    taken: bool = False  # claimed by a start: no other start may have it
    served: bool = False  # it took its launch: a worker now, the supervisor's to watch
    hello: asyncio.Event = field(default_factory=asyncio.Event, repr=False)  # it connected
    waiter: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    @property
    def connected(self) -> bool:
        return self.hello.is_set()


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
        self.warmups: deque[float] = deque(maxlen=WARMUPS_KEPT)  # spawn → connected, seconds
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

    @property
    def cold_start_s(self) -> float:
        """How long a fresh interpreter would take to be up now: the longest recent warm-up."""
        return max(self.warmups, default=FIRST_COLD_START_S)

    def identify(self, pid: int) -> WorkerKey | None:
        """The spare with this process id (called when a process connects to the channel);
        only its first connection is the spare's, as a claimed one's may be."""
        for spare in self._spares.values():
            if spare.proc.pid == pid and spare.alive and not spare.connected:
                spare.hello.set()
                self.warmups.append(time.monotonic() - spare.started_at)
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

    def claim(self) -> SpareClaim | None:
        """Hold a spare for one start: a connected one, else the one furthest along in warming
        up, which goes to full priority now that a start waits on it. None when there is none."""
        while self.enabled:
            candidates = self.ready() or sorted(self.waiting(), key=lambda s: s.started_at)
            if not candidates:
                return None
            spare = candidates[0]
            spare.taken = True
            if self.channel.connected(spare.key):
                self._not_before = time.monotonic() + self.delay_s
            # else: start the next one now, niced; the node has no spare ready for the next fault
            self._wake.set()  # start the next spare soon
            if self._full_priority(spare):
                return SpareClaim(spare.key, self.channel.connected(spare.key))
            kill_group(spare.proc.pid)
        return None

    async def take(
        self, claim: SpareClaim, key: WorkerKey, launch: SpareLaunch, log_path: Path
    ) -> asyncio.subprocess.Process | None:
        """Hand the claimed spare ``launch`` as the worker ``key``, once it is connected; its
        process, or None (the spare killed) when it died, was late or did not take it."""
        spare = self._spares.get(claim.spare.rank)
        if spare is None or not await self._connected(spare):
            self.drop(claim)
            return None
        # Adopted first: the worker it becomes may report before the send returns, and
        # those reports must already read as the job's, not the spare's.
        self.channel.adopt(spare.key, key)
        if not await self.channel.send_to_worker(spare.key, launch):
            log.warning("spare did not take its launch; killing it", pid=spare.proc.pid)
            self.drop(claim)
            return None
        spare.served = True
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # the open descriptor follows the rename
            os.replace(spare.log_path, log_path)
        self.served += 1
        log.info("start served by a spare", job=key.job_id, rank=key.rank, pid=spare.proc.pid)
        return spare.proc

    def drop(self, claim: SpareClaim) -> None:
        """Kill a claimed spare that will not become a worker (its start gave up on it)."""
        spare = self._spares.get(claim.spare.rank)
        if spare is not None and spare.alive and not spare.served:
            kill_group(spare.proc.pid)

    async def _connected(self, spare: Spare) -> bool:
        """Wait until the spare connects or dies, for at most as long as a fresh interpreter
        started now would take: past that, waiting on it was the slower choice."""
        if not spare.connected and spare.alive and spare.waiter is not None:
            hello = asyncio.create_task(spare.hello.wait())
            either = {hello, spare.waiter}
            try:
                await asyncio.wait(either, timeout=self.cold_start_s, return_when=FIRST_COMPLETED)
            finally:
                hello.cancel()
        if not spare.connected:
            log.warning("warming spare died or was late; starting cold", pid=spare.proc.pid)
        return spare.connected and spare.alive

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
        self._spares.pop(spare.key.rank, None)
        if spare.taken or self._closing:
            return  # a worker now, the supervisor's to watch, or one its start gave up on
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
