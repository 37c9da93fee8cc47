"""Before a worker starts: what it runs, read from the job record, and what it needs on this node.

A ``StartWorker`` only names a job and a seat. The agent reads the job from Redis (the record
the API accepted), so nothing from the bus becomes a command line; a start for a job that is
gone, over, or at another generation starts nothing. For an entrypoint job it then
restores the newest snapshot of the job's checkpoint directory for its rank 0
(:mod:`unicron.services.agent.mirror`), makes the working directory (an uploaded package is
fetched and unpacked) and finds the generation's master store
(:mod:`unicron.services.agent.master`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

from unicron.services.agent.launch import JobContext
from unicron.services.agent.master import MasterStores, MasterUnavailableError
from unicron.services.agent.packages import PackageDirs
from unicron.services.agent.workers import CommandRejectedError
from unicron.shared.bus.packages import PackageError
from unicron.shared.contracts.messages import StartWorker
from unicron.shared.logging import get_logger
from unicron.shared.store.state import StateStore

log = get_logger(component="prepare")
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


class LaunchRefusedError(RuntimeError):
    """The job's worker cannot start on this node, and trying again cannot help."""

    def __init__(self, exc_type: str, message: str) -> None:
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message


def checkpoint_dir(root: Path, job_id: str) -> Path:
    """Where this node keeps the job's checkpoints: under the agent's own data directory. The
    id names a record the API created; the check keeps a forged one from naming a path."""
    if not _JOB_ID.fullmatch(job_id):
        raise CommandRejectedError(f"job id {job_id!r} is not one the API issues")
    return root / job_id


class StartPreparer:
    def __init__(
        self,
        state: StateStore,
        packages: PackageDirs,
        masters: MasterStores,
        checkpoints: Path,
        restore: Callable[[str], Awaitable[object]] | None = None,
    ) -> None:
        self.state = state
        self.packages = packages
        self.masters = masters
        self.checkpoints = checkpoints.absolute()  # workers may change directory
        self.restore = restore  # the job's newest checkpoint snapshot, before its rank 0 starts

    async def prepare(self, cmd: StartWorker) -> JobContext | None:
        """The context of the start, or None when the start is stale. Raises
        ``CommandRejectedError`` for a job with no record, ``LaunchRefusedError`` for a package
        that cannot be had or a master store that cannot be hosted."""
        wlog = log.bind(job_id=cmd.job_id, generation=cmd.generation, rank=cmd.rank)
        job = await self.state.get_job(cmd.job_id)
        if job is None:
            raise CommandRejectedError(f"job {cmd.job_id!r} has no record; nothing to start")
        if job.state.terminal or job.generation != cmd.generation:
            wlog.info("stale start ignored", state=job.state.value, current=job.generation)
            return None
        spec = job.spec
        checkpoints = checkpoint_dir(self.checkpoints, job.id)
        if spec.entrypoint is None:
            return JobContext(spec, checkpoints, job.recoveries)
        if cmd.rank == 0 and self.restore is not None:
            await self.restore(job.id)  # unicron.services.agent.mirror
        with contextlib.suppress(OSError):  # the script's to make, where it may not be ours
            await asyncio.to_thread(checkpoints.mkdir, parents=True, exist_ok=True)
        cwd = Path(spec.working_dir) if spec.working_dir else None
        if spec.package is not None:
            try:
                cwd = await self.packages.directory(cmd.job_id, spec.package)
            except PackageError as exc:
                raise LaunchRefusedError("PackageError", str(exc)) from exc
        try:
            master = await self.masters.address(cmd.job_id, cmd.generation, cmd.rendezvous)
        except MasterUnavailableError as exc:
            raise LaunchRefusedError("MasterStoreUnavailable", str(exc)) from exc
        return JobContext(spec, checkpoints, job.recoveries, cwd, master)
