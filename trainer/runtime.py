"""The worker runtime: what one rank of a job needs around the user's training loop.

:class:`Runtime` says hello to the agent over the local channel, routes the agent's
directives (fault drills to :mod:`unicron.trainer.faults`, regroups to
:mod:`unicron.trainer.regroup`), joins the generation's process group through the agent-hosted TCP
store, and once the user's model and optimizer are known runs them as an
:class:`~unicron.trainer.elastic.ElasticRank`. It reports each exception that ends the rank *once*,
classified, before the process dies, so the control plane knows why a rank failed within seconds
(docs/design.md §3); :mod:`unicron.train` is the public face that calls it.

Outside Unicron (no launch) the runtime is *local* (:mod:`unicron.trainer.local`): one process, no
agent, no process group — the same code path, for debugging a script.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# torch re-exports the stores from its C extension without listing them for type checkers.
from unicron.shared.contracts.identity import who
from unicron.shared.contracts.messages import RegroupDirective
from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.reports import WorkerException, WorkerHello
from unicron.shared.contracts.workerchannel import (
    AnyWorkerDirective,
    FaultDirective,
    WorkerEnv,
    WorkerLaunch,
)
from unicron.shared.logging import get_logger
from unicron.trainer import comm
from unicron.trainer.channel import AgentChannel
from unicron.trainer.classify import classify, describe_chain
from unicron.trainer.elastic import ElasticRank, ParkExpired
from unicron.trainer.faults import FaultInbox
from unicron.trainer.local import Offline, local_launch, local_spec
from unicron.trainer.loop import Channel
from unicron.trainer.parallel import Scheduler
from unicron.trainer.regroup import RegroupInbox
from unicron.trainer.replica import Replica

log = get_logger(component="unicron.trainer.runtime")

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
    park_timeout_s: float = field(default_factory=lambda: WorkerEnv.read().park_timeout_s)


class Runtime:
    """One rank's services; see the module doc. ``launch=None`` runs locally with ``spec``."""

    def __init__(
        self,
        launch: WorkerLaunch | None,
        options: RuntimeOptions | None = None,
        spec: JobSpec | None = None,
    ) -> None:
        self.local = launch is None
        self.launch = launch if launch is not None else local_launch(spec or local_spec())
        self.options = options or RuntimeOptions()
        self.device = _device()
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.rank: ElasticRank | None = None
        self._reported: list[BaseException] = []
        launch = self.launch
        self.regroups = RegroupInbox(launch.job_id, launch.generation)
        self.faults = FaultInbox(launch.rank)
        self.channel: Channel = Offline()
        if not self.local:
            torch.set_num_threads(1)  # ranks share the node's cores; oversubscription slows all
            warm_up()
            self.channel = AgentChannel(
                launch.agent_socket, on_directive=directive_router(self.faults, self.regroups)
            )
            # Now, not at the first step, so the agent can reach this rank from the start.
            seat = WorkerHello(**launch.key._asdict())
            self.channel.send(seat)
        # A joiner forms its group in the hand-off, once it holds a replica to hand off.
        self._group = None if launch.state_source_rank is not None else self.join(launch)

    def join(self, launch: WorkerLaunch) -> dist.ProcessGroup | None:
        return None if self.local else join_process_group(launch, self.backend, self.options)

    def start(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Scheduler | None = None,
    ) -> ElasticRank:
        """Run ``model`` and ``optimizer`` as this rank, resumed from where the job is."""
        if self.rank is not None:
            raise RuntimeError("wrap() once per run: this run already trains a model")
        replica = Replica(model, optimizer, next_step=1, has_state=False, scheduler=scheduler)
        group, self._group = self._group, None  # the rank owns it now (and lets it go)
        rank = self.rank = ElasticRank(
            self.launch,
            replica,
            self.channel,
            self.faults,
            self.regroups,
            group=group,
            device=self.device,
            join=self.join,
            report_failure=functools.partial(self.report, parked=True),
            park_timeout_s=self.options.park_timeout_s,
            backend=self.backend,
        )
        rank.resume()
        return rank

    def report(self, exc: BaseException, parked: bool = False) -> bool:
        """Classify ``exc`` and send it as this rank's ``WorkerException``, unless it (or an
        exception it was raised from) was already reported or explained; ``parked`` when the
        rank stays alive, waiting for a regroup. True when the traceback of ``exc`` itself is
        on stderr (printed now or before)."""
        if any(exc is done for done in self._reported):
            return not isinstance(exc, ParkExpired)
        self._reported.append(exc)
        if isinstance(exc, ParkExpired):
            log.error("no regroup came; exiting", rank=self.launch.rank)
            return False  # the failure that parked it was reported then
        if any(seen is done for seen in _chain(exc) for done in self._reported[:-1]):
            return False
        launch = self.rank.launch if self.rank is not None else self.launch  # after regroups
        step = self.rank.step if self.rank is not None else None
        category = classify(exc)
        text = describe_chain(exc)
        # A plain traceback: the structured logger's rich one dumps every local, tensors too.
        traceback.print_exception(exc, file=sys.stderr)
        log.error("step failed", rank=launch.rank, step=step, category=category.value)
        self.channel.send(
            WorkerException(
                **who(launch.node_id, launch.key),
                pid=os.getpid(),
                exc_type=type(exc).__name__,
                message=text[:MESSAGE_LIMIT],
                category=category.value,
                step=step,
                parked=parked,
            )
        )
        return True

    def close(self, failed: bool) -> None:
        """Get the last reports out and leave the process group."""
        self.channel.flush(self.options.flush_timeout_s)
        self.channel.close()
        self._group = None
        # The process is about to exit, which frees any NCCL communicator; tearing one down
        # can hang. Gloo's teardown is immediate and lets in-process callers run again.
        if self.backend != "nccl":
            comm.leave(lambda: None, self.backend)


def directive_router(
    faults: FaultInbox, regroups: RegroupInbox
) -> Callable[[AnyWorkerDirective], None]:
    """What the channel's reader thread does with a directive: hand it to its inbox."""

    def route(directive: AnyWorkerDirective) -> None:
        if isinstance(directive, FaultDirective):
            faults.offer(directive.fault)
        elif isinstance(directive, RegroupDirective):
            regroups.offer(directive)
        else:  # a launch is for a spare that has not become a worker yet
            log.info("directive ignored by a running worker", directive=directive.directive)

    return route


def warm_up() -> None:
    """Import what a step needs before the first process group exists.

    The first optimizer imports most of torch's compiler stack (~800 modules, seconds), and
    that import takes references to the default process group if one exists: the group would
    then outlive ``destroy_process_group`` and peers blocked on it would never learn it is
    gone. One step on a throwaway scalar does the import now, before any group.
    """
    scalar = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.AdamW([scalar])
    torch.autograd.backward(scalar.sum())
    optimizer.step()


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or during."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _device() -> torch.device:
    # The agent gives each GPU worker exactly one visible device, so it is always the first.
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def join_process_group(
    launch: WorkerLaunch, backend: str, options: RuntimeOptions
) -> dist.ProcessGroup:
    """Join this generation's group through the agent's store, under the generation's prefix
    (:func:`unicron.trainer.comm.join`). A group is formed even for one rank so that
    single-process runs take the same code path."""
    return comm.join(launch, backend, options.store_timeout_s, options.collective_timeout_s)
