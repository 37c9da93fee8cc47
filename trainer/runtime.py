"""The worker runtime: one rank of one generation of a job, from launch to exit code.

It says hello to the agent, joins the generation's process group through the agent-hosted
TCP store, resumes from the newest checkpoint and trains ``spec.steps`` steps, each watched by
a :class:`~trainer.loop.StepMonitor` (phases, compute time, step reports, fault drills). Any
exception is caught, classified and reported *before* the process dies, so the control plane
knows why a rank failed within seconds (DESIGN.md §3); the exit code is then 1.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# torch re-exports the stores from its C extension without listing them for type checkers.
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

from shared.logging import get_logger
from shared.messages import WorkerException, WorkerHello, WorkerLaunch
from trainer import checkpoint
from trainer.channel import AgentChannel, Directive
from trainer.classify import classify, describe_chain
from trainer.faults import FaultInbox
from trainer.loop import StepMonitor, Trainee, run_step
from trainer.model import GPT, build_model
from trainer.parallel import make_optimizer

log = get_logger(component="trainer.runtime")

# Reports carry the message for people and the detector; the full text stays in the log.
MESSAGE_LIMIT = 4000


@dataclass(frozen=True)
class RuntimeOptions:
    store_timeout_s: float = 60.0
    # How long a collective may wait for a silent peer; hangs are normally caught sooner by
    # the detector's step-time statistics, this only bounds the worst case.
    collective_timeout_s: float = 300.0
    # How long a dying worker waits for its last report to reach the agent.
    flush_timeout_s: float = 2.0


@dataclass(frozen=True)
class StepContext:
    """What a fault hook sees at the start of a step."""

    step: int
    launch: WorkerLaunch
    model: GPT
    optimizer: torch.optim.Optimizer


# Called at the start of every step; raising from it fails the step like a real fault would.
FaultHook = Callable[[StepContext], None]


@dataclass
class _Progress:
    step: int | None = None
    backend: str = "gloo"


def run(
    launch: WorkerLaunch,
    *,
    fault_hook: FaultHook | None = None,
    on_directive: Callable[[Directive], None] | None = None,
    options: RuntimeOptions | None = None,
) -> int:
    """Train this rank to the end of the job; returns the process exit code (0 or 1).

    Fault directives from the agent arm drills (:mod:`trainer.faults`); any other directive
    goes to ``on_directive`` (logged when there is none).
    """
    options = options or RuntimeOptions()
    torch.set_num_threads(1)  # ranks share the node's cores; oversubscription only slows all
    inbox = FaultInbox(launch.rank, on_other=on_directive)
    channel = AgentChannel(launch.agent_socket, on_directive=inbox.offer)
    # Connects now, not at the first step, so the agent can reach this rank from the start.
    channel.send(WorkerHello(job_id=launch.job_id, generation=launch.generation, rank=launch.rank))
    progress = _Progress()
    code = 0
    try:
        _train(launch, channel, inbox, options, progress, fault_hook)
    except Exception as exc:
        code = 1
        _report_exception(launch, channel, progress, exc)
    finally:
        channel.flush(options.flush_timeout_s)
        channel.close()
        _leave_process_group(failed=code != 0, backend=progress.backend)
    return code


def _train(
    launch: WorkerLaunch,
    channel: AgentChannel,
    inbox: FaultInbox,
    options: RuntimeOptions,
    progress: _Progress,
    fault_hook: FaultHook | None,
) -> None:
    spec = launch.spec
    device = _device()
    progress.backend = "nccl" if device.type == "cuda" else "gloo"
    model = build_model(spec.model, spec.seed, device)
    optimizer = make_optimizer(model)
    group = join_process_group(launch, progress.backend, options)
    start = _resume(launch, model, optimizer, group, device)
    trainee = Trainee(launch, model, optimizer, group)
    resumed_from = start if start > 0 else None
    monitor = StepMonitor(launch, channel, inbox, resumed_from=resumed_from, device=device)
    log.info("training", rank=launch.rank, world=launch.world_size, start=start, end=spec.steps)
    for step in range(start + 1, spec.steps + 1):
        progress.step = step
        if fault_hook is not None:
            fault_hook(StepContext(step, launch, model, optimizer))
        run_step(trainee, step, monitor)


def _device() -> torch.device:
    # The agent gives each GPU worker exactly one visible device, so it is always the first.
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def join_process_group(
    launch: WorkerLaunch, backend: str, options: RuntimeOptions
) -> dist.ProcessGroup:
    """Join this generation's group through the agent's store, under the generation's prefix.

    A group is formed even for one rank so that single-process runs take the same code path.
    """
    rendezvous = launch.rendezvous
    store = TCPStore(
        rendezvous.host,
        rendezvous.port,
        is_master=False,
        timeout=timedelta(seconds=options.store_timeout_s),
    )
    dist.init_process_group(
        backend=backend,
        store=PrefixStore(rendezvous.prefix, store),
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=timedelta(seconds=options.collective_timeout_s),
    )
    group = dist.group.WORLD
    assert group is not None  # init_process_group just created it
    return group


def _resume(
    launch: WorkerLaunch,
    model: GPT,
    optimizer: torch.optim.Optimizer,
    group: dist.ProcessGroup,
    device: torch.device,
) -> int:
    """Continue from rank 0's newest checkpoint; returns the step it holds (0 for none).

    Rank 0 reads the file and broadcasts the state, so ranks on nodes that cannot see the
    checkpoint directory still start from the same bits as rank 0.
    """
    found = checkpoint.load_latest(launch.checkpoint_dir) if launch.rank == 0 else None
    payload: list[object] = [found]
    broadcast_device = device if device.type == "cuda" else None
    dist.broadcast_object_list(payload, src=0, group=group, device=broadcast_device)
    received = payload[0]
    if received is None:
        return 0
    assert isinstance(received, tuple)
    step, state = received
    checkpoint.restore(model, optimizer, state)
    log.info("resumed", rank=launch.rank, step=step)
    return int(step)


def _report_exception(
    launch: WorkerLaunch, channel: AgentChannel, progress: _Progress, exc: Exception
) -> None:
    category = classify(exc)
    text = describe_chain(exc)
    # A plain traceback: the structured logger's rich one dumps every local, tensors included.
    traceback.print_exception(exc, file=sys.stderr)
    log.error("step failed", rank=launch.rank, step=progress.step, category=category.value)
    channel.send(
        WorkerException(
            node_id=launch.node_id,
            job_id=launch.job_id,
            generation=launch.generation,
            rank=launch.rank,
            pid=os.getpid(),
            exc_type=type(exc).__name__,
            message=text[:MESSAGE_LIMIT],
            category=category.value,
            step=progress.step,
        )
    )


def _leave_process_group(failed: bool, backend: str) -> None:
    if not dist.is_initialized():
        return
    # Tearing down a NCCL communicator with a broken peer can hang; the process is about to
    # exit anyway, which frees everything. Gloo teardown is immediate and lets in-process
    # callers (tests, embedding scripts) run again.
    if failed and backend == "nccl":
        return
    dist.destroy_process_group()
