"""What a worker process is: its argv, environment and working directory, decided in one place.

A fresh launch (:mod:`unicron.services.agent.supervisor`) and a warm spare that takes a launch
(:mod:`unicron.services.agent.spares`) both get a worker's identity from here: a spare is sent
the very argv, environment and directory a fresh process would get, so it runs the job's trainer.
A job on the reference trainer runs ``python -m <registered module>``; a job with its own
``entrypoint`` runs that argv in its working directory with the environment ``torchrun`` gives a
worker, so a script written for torchrun (``dist.init_process_group`` from the environment) runs
unchanged. Everything comes from the job record the API accepted (``JobContext``), never from a
bus message.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from unicron.services.agent.registry import EntrypointRegistry
from unicron.shared.contracts.messages import StartWorker
from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.workerchannel import WorkerEnv, WorkerLaunch
from unicron.shared.servers.credentials import without_credentials

PYTHON_NAMES = frozenset({"python", "python3"})


@dataclass(frozen=True)
class JobContext:
    """What the agent resolved for one start, from the job record and on this node."""

    spec: JobSpec
    checkpoint_dir: Path  # derived by this agent under its own data dir, never from the bus
    restarts: int = 0  # restarts of the job so far (TORCHELASTIC_RESTART_COUNT)
    cwd: Path | None = None  # the working directory on this node (an unpacked package, say)
    master: tuple[str, int] | None = None  # this generation's torch store, for entrypoint jobs


class ProcessLaunch(NamedTuple):
    argv: list[str]
    env: dict[str, str]
    cwd: Path | None


def worker_launch(cmd: StartWorker, ctx: JobContext, node_id: str, socket: Path) -> WorkerLaunch:
    """The ``UNICRON_WORKER_LAUNCH`` JSON: everything the worker runtime needs."""
    return WorkerLaunch(
        node_id=node_id,
        job_id=cmd.job_id,
        generation=cmd.generation,
        rank=cmd.rank,
        world_size=cmd.world_size,
        spec=ctx.spec,
        rendezvous=cmd.rendezvous,
        checkpoint_dir=str(ctx.checkpoint_dir),
        agent_socket=str(socket),
        state_source_rank=cmd.state_source_rank,
    )


def torchrun_env(cmd: StartWorker, ctx: JobContext, error_file: Path | None) -> dict[str, str]:
    """The variables torchrun's elastic agent sets for a worker (torch.distributed.run); with
    ``error_file``, the rank's own TORCHELASTIC_ERROR_FILE, where ``@record`` writes the
    exception that ends the script (read at its exit, services/agent/errorfile.py)."""
    if ctx.master is None:
        raise ValueError("an entrypoint job needs its generation's master store")
    host, port = ctx.master
    recorded = {} if error_file is None else {"TORCHELASTIC_ERROR_FILE": str(error_file)}
    return {
        **recorded,
        "RANK": str(cmd.rank),
        "LOCAL_RANK": str(cmd.local_rank),
        "WORLD_SIZE": str(cmd.world_size),
        "LOCAL_WORLD_SIZE": str(cmd.local_world_size),
        "GROUP_RANK": str(cmd.group_rank),
        "ROLE_RANK": str(cmd.rank),
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(cmd.world_size),
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": str(ctx.restarts),
        "TORCHELASTIC_MAX_RESTARTS": str(ctx.spec.max_restarts),
        "TORCHELASTIC_RUN_ID": cmd.job_id,
        # every rank is a client of the store the agents host: a fresh one per generation
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }


def process_launch(
    cmd: StartWorker,
    ctx: JobContext,
    *,
    node_id: str,
    socket: Path,
    registry: EntrypointRegistry,
    slot_env: dict[str, str],
    error_file: Path | None = None,
) -> ProcessLaunch:
    """(argv, env, cwd) of the worker for ``cmd``: the agent's environment without its own
    credentials (the user's code must not log in as the agent) + the job's env + the GPU slot +
    Unicron's and (for an entrypoint job) torchrun's variables, which nothing may override. A
    worker given a GPU slot sees that one device only and is local rank 0 of 1 on it.

    Raises ``UnknownTrainerError`` for a trainer this node has not registered."""
    spec = ctx.spec
    launch = worker_launch(cmd, ctx, node_id, socket)
    env = {
        **without_credentials(os.environ),
        **spec.env,
        **slot_env,
        **WorkerEnv(
            launch=launch,
            agent_socket=str(socket),
            job_id=cmd.job_id,
            checkpoint_dir=str(ctx.checkpoint_dir),
        ).to_environ(),
    }
    if spec.entrypoint is None:
        return ProcessLaunch(registry.argv(spec.trainer), env, ctx.cwd)
    env.update(torchrun_env(cmd, ctx, error_file))
    if slot_env:
        # It sees exactly one GPU, as cuda:0: it is torchrun's lone worker of a one-GPU machine,
        # so the usual torch.cuda.set_device(LOCAL_RANK) picks its own device.
        env.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(cmd.rank))
    if cmd.local_world_size > 1:
        # As torchrun does: ranks that share a machine would each start a thread per core.
        env.setdefault("OMP_NUM_THREADS", "1")
    return ProcessLaunch(_interpreter(list(spec.entrypoint)), env, ctx.cwd)


def _interpreter(argv: list[str]) -> list[str]:
    """A bare ``python`` means the agent's own interpreter, as with torchrun, which runs a
    script with ``sys.executable``: the PATH of an agent started from a virtualenv need not
    lead to the interpreter that has torch and unicron."""
    if argv[0] in PYTHON_NAMES:
        return [sys.executable, *argv[1:]]
    return argv


def spare_can_run(argv: list[str]) -> bool:
    """Whether a warm spare (a Python with torch and unicron loaded) can become this worker:
    a Python script or module on the agent's interpreter, which a registered trainer always is
    and a job's own entrypoint may be."""
    if len(argv) < 2 or argv[0] != sys.executable:
        return False
    if argv[1] == "-m":
        return len(argv) > 2
    return not argv[1].startswith("-")  # interpreter flags change what a fresh process is


async def spawn_logged(
    argv: list[str],
    env: dict[str, str],
    log: Path,
    preexec: Callable[[], None],
    cwd: Path | None = None,
) -> asyncio.subprocess.Process:
    """Start a worker or a spare in its own session, its stdout and stderr appended to ``log``
    (the child keeps its own copy of the descriptor)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec,
        )
