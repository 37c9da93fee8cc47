"""The worker runtime: one rank of one generation of a job, from launch to exit code.

It says hello to the agent, joins the generation's process group through the agent-hosted
TCP store, resumes from the newest checkpoint (or, as a joiner, from a live peer) and trains
``spec.steps`` steps, each watched by a :class:`~trainer.loop.StepMonitor` (phases, compute
time, step reports, fault drills), regrouping in place when told to or when a peer dies
(:mod:`trainer.elastic`). Any exception is caught, classified and reported *before* the
process dies, so the control plane knows why a rank failed within seconds (DESIGN.md §3); the
exit code is then 1 — also when a parked worker got no regroup directive in time.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

# torch re-exports the stores from its C extension without listing them for type checkers.
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

from unicron.shared.logging import get_logger
from unicron.shared.messages import WorkerLaunch
from unicron.shared.reports import WorkerException, WorkerHello
from unicron.trainer.channel import AgentChannel, Directive
from unicron.trainer.classify import classify, describe_chain
from unicron.trainer.elastic import ElasticRank, ParkExpired
from unicron.trainer.faults import FaultInbox
from unicron.trainer.handoff import Replica
from unicron.trainer.model import GPT
from unicron.trainer.regroup import RegroupInbox, park_timeout_from_env

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
    # How long a worker whose peer died keeps its memory waiting for a regroup directive.
    park_timeout_s: float = field(default_factory=park_timeout_from_env)


@dataclass(frozen=True)
class StepContext:
    """What a fault hook sees at the start of a step."""

    step: int
    launch: WorkerLaunch
    model: GPT
    optimizer: torch.optim.Optimizer


# Called at the start of every step; raising from it fails the step like a real fault would.
FaultHook = Callable[[StepContext], None]


def run(
    launch: WorkerLaunch,
    *,
    fault_hook: FaultHook | None = None,
    on_directive: Callable[[Directive], None] | None = None,
    options: RuntimeOptions | None = None,
) -> int:
    """Train this rank to the end of the job; returns the process exit code (0 or 1).

    Fault directives from the agent arm drills (:mod:`trainer.faults`), regroup directives
    re-form the group in place (:mod:`trainer.elastic`); any other directive goes to
    ``on_directive`` (logged when there is none).
    """
    options = options or RuntimeOptions()
    torch.set_num_threads(1)  # ranks share the node's cores; oversubscription only slows all
    regroups = RegroupInbox(launch.job_id, launch.generation)

    def other(directive: Directive) -> None:
        if regroups.offer(directive):
            return
        if on_directive is not None:
            on_directive(directive)
        else:
            log.info("non-fault directive ignored", directive=str(directive)[:200])

    inbox = FaultInbox(launch.rank, on_other=other)
    channel = AgentChannel(launch.agent_socket, on_directive=inbox.offer)
    # Connects now, not at the first step, so the agent can reach this rank from the start.
    channel.send(WorkerHello(job_id=launch.job_id, generation=launch.generation, rank=launch.rank))
    device = _device()
    backend = "nccl" if device.type == "cuda" else "gloo"
    elastic = ElasticRank(
        launch,
        channel,
        inbox,
        regroups,
        device=device,
        join=lambda joining: join_process_group(joining, backend, options),
        report_failure=lambda exc: _report_exception(elastic, channel, exc),
        park_timeout_s=options.park_timeout_s,
        on_step=_hook_caller(fault_hook),
    )
    code = 0
    try:
        elastic.train()
    except ParkExpired:
        code = 1  # the failure that parked it was reported then
        log.error("no regroup came; exiting", rank=elastic.launch.rank)
    except Exception as exc:
        code = 1
        _report_exception(elastic, channel, exc)
    finally:
        channel.flush(options.flush_timeout_s)
        channel.close()
        _leave_process_group(failed=code != 0, backend=backend)
    return code


def _hook_caller(
    fault_hook: FaultHook | None,
) -> Callable[[int, WorkerLaunch, Replica], None] | None:
    if fault_hook is None:
        return None

    def call(step: int, launch: WorkerLaunch, replica: Replica) -> None:
        fault_hook(StepContext(step, launch, replica.model, replica.optimizer))

    return call


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


def _report_exception(elastic: ElasticRank, channel: AgentChannel, exc: Exception) -> None:
    launch = elastic.launch  # the current generation and rank, after any regroup
    category = classify(exc)
    text = describe_chain(exc)
    # A plain traceback: the structured logger's rich one dumps every local, tensors included.
    traceback.print_exception(exc, file=sys.stderr)
    log.error("step failed", rank=launch.rank, step=elastic.step, category=category.value)
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
            step=elastic.step,
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
