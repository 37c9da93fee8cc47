"""One rank's life across generations: step, and when the group breaks or the control plane
re-forms it, regroup in place without leaving the process (docs/design.md §5).

:class:`ElasticRank` owns the rank's memory (the user's model, optimizer and scheduler, the
step, the step in progress) and its current membership (generation, rank, world, process
group). :meth:`ElasticRank.batches` is its loop, a generator: it yields the micro-batches this
rank owes, built from the user's data by ``fetch(step, index)``, and the caller (the user's
loop body) does each forward and backward between two of them:

- a pending ``RegroupDirective`` is applied between two micro-batches — at a step boundary or
  mid-step — which is how a job is shrunk, grown, migrated or reattempted while healthy;
- a step whose collective fails because a peer is gone is reported, the broken group is torn
  down, and the rank *parks* with its memory until a directive comes (bounded by the park
  timeout, after which it fails as before);
- a regroup joins the new group through the agent's store under the directive's prefix, hands
  the state off (:mod:`unicron.trainer.handoff`), sends a new ``WorkerHello`` and
  ``WorkerRegrouped`` and steps on; a worker launched with ``state_source_rank`` starts the same
  way, as a joiner;
- when the transfer itself fails (the source died), a rank without state takes the newest
  checkpoint it reaches alone (:func:`unicron.trainer.resume.fall_back_to_disk`), reports
  ``WorkerRegrouped(state_source="disk")`` and parks for the next group.

Its checkpoints are a :class:`~unicron.trainer.storage.CheckpointStore`: the node's directory and
the object store, if the job has one; a run that finishes waits there for its last upload.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch
import torch.distributed as dist
from unicron.shared.contracts.identity import who
from unicron.shared.contracts.messages import GroupSeat, RegroupDirective
from unicron.shared.contracts.reports import WorkerHello, WorkerRegrouped
from unicron.shared.contracts.transitions import StateSource
from unicron.shared.contracts.workerchannel import WorkerLaunch
from unicron.shared.logging import get_logger
from unicron.trainer import comm
from unicron.trainer.faults import FaultInbox
from unicron.trainer.handoff import Handoff, hand_off
from unicron.trainer.ledger import Ledger
from unicron.trainer.loop import Channel, StepMonitor, Trainee, step_micro_batches
from unicron.trainer.parallel import StepInterrupted
from unicron.trainer.regroup import PendingRegroup, RegroupInbox, is_peer_failure
from unicron.trainer.replica import Replica
from unicron.trainer.resume import fall_back_to_disk, resume_from_checkpoint
from unicron.trainer.storage import CheckpointStore

log = get_logger(component="unicron.trainer.elastic")

T = TypeVar("T")
Join = Callable[[WorkerLaunch], dist.ProcessGroup | None]


class ParkExpired(Exception):
    """Parked after a peer failure (already reported) and no regroup directive came."""


class ElasticRank:
    """See the module doc. ``group`` is the launch's group, already joined (None for a
    joiner, which joins in its hand-off); ``join`` forms the group of a later generation;
    ``report_failure`` sends the ``WorkerException`` of a peer failure before parking."""

    def __init__(
        self,
        launch: WorkerLaunch,
        replica: Replica,
        channel: Channel,
        faults: FaultInbox,
        regroups: RegroupInbox,
        *,
        group: dist.ProcessGroup | None,
        device: torch.device,
        join: Join,
        report_failure: Callable[[Exception], object],
        park_timeout_s: float,
        backend: str = "gloo",
    ) -> None:
        self.launch = launch
        self.replica = replica
        self.step: int | None = None
        self._channel = channel
        self._faults = faults
        self._regroups = regroups
        self._device = device
        self._join = join
        self._report_failure = report_failure
        self._park_timeout_s = park_timeout_s
        self._ledger = Ledger(launch.checkpoint_dir)
        self._store = CheckpointStore.for_launch(launch)
        self._group = group
        self._trainee: Trainee | None = None
        self._monitor: StepMonitor | None = None
        self._in_handoff = False
        self._backend = backend
        if backend == "nccl":  # a directive frees a collective blocked on a dead peer
            regroups.interrupt = self._abort_group

    def resume(self) -> None:
        """Take the state this launch starts from: the job's newest checkpoint, wherever a
        rank finds it, or for a joiner, the state a live peer hands it at the first batch."""
        launch = self.launch
        if launch.state_source_rank is None:
            start = resume_from_checkpoint(self.replica, launch.rank, self._group, self._store)
            self._enter(launch, resumed_from=start if start > 0 else None)
        else:
            self._regroups.generation = launch.generation - 1  # so its own launch is not stale
            self._regroups.offer(_directive_of(launch))

    def batches(self, fetch: Callable[[int, int], T]) -> Iterator[T]:
        """This rank's micro-batches up to the job's last step, each followed by the caller's
        :meth:`backward`; raises what ends the process (see module doc)."""
        while self.replica.next_step <= self.launch.spec.steps:
            try:
                pending = self._regroups.take()
                if pending is not None:
                    self._regroup(pending)
                else:
                    yield from self._step(fetch)
            except StepInterrupted:
                continue  # the directive is taken at the top of the loop
            except Exception as exc:
                if not self._peer_lost(exc):
                    raise
                if not self._regroups.pending():
                    # A directive already here explains the failure: we broke the group.
                    self._report_failure(exc)
                # The failed collective's frames hold the old group; while anything does,
                # gloo keeps its connections open and peers blocked on us never learn.
                traceback.clear_frames(exc.__traceback__)
                self._park(exc)
        self._store.finish()  # the last checkpoint's upload, if any, before the process ends

    def backward(self, loss: torch.Tensor) -> None:
        if self._trainee is None:
            raise RuntimeError("backward() before the first batch of run.batches()")
        self._trainee.backward(loss)

    # --- steps ---------------------------------------------------------------------------

    def _enter(self, launch: WorkerLaunch, resumed_from: int | None) -> None:
        """Start stepping as ``launch`` says (a new generation, rank or world)."""
        self.launch = launch
        self._faults.rank = launch.rank
        self._monitor = StepMonitor(
            launch, self._channel, self._faults, resumed_from=resumed_from, device=self._device
        )
        self._trainee = Trainee(
            launch,
            self.replica.model,
            self.replica.optimizer,
            self._group,
            work=self.replica.work,
            interrupted=self._regroups.pending,
            ledger=self._ledger,
            scheduler=self.replica.scheduler,
            checkpoints=self._store,
        )
        log.info(
            "training",
            generation=launch.generation,
            rank=launch.rank,
            world=launch.world_size,
            next_step=self.replica.next_step,
            end=launch.spec.steps,
        )

    def _step(self, fetch: Callable[[int, int], T]) -> Iterator[T]:
        trainee, replica = self._trainee, self.replica
        assert trainee is not None
        step = self.step = replica.next_step
        try:
            for index in step_micro_batches(trainee, step, self._monitor):
                yield fetch(step, index)
        finally:
            replica.work = trainee.work  # what is left of the step if it did not complete
        replica.next_step = step + 1

    # --- failures and regroups ----------------------------------------------------------------

    def _peer_lost(self, exc: Exception) -> bool:
        in_collective = self._in_handoff or (
            self._monitor is not None and self._monitor.in_collective
        )
        return in_collective and is_peer_failure(exc)

    def _park(self, exc: Exception) -> None:
        self._leave()
        done = 0 if self.replica.work is None else len(self.replica.work.done)
        log.warning("parked", step=self.replica.next_step, done=done, limit=self._park_timeout_s)
        if not self._regroups.wait(self._park_timeout_s):
            raise ParkExpired(f"no regroup directive within {self._park_timeout_s} s") from exc

    def _leave(self) -> None:
        if self._monitor is not None:
            self._monitor.in_collective = False
        self._in_handoff = False
        comm.leave(self._take_group, self._backend)

    def _take_group(self) -> dist.ProcessGroup | None:
        """The old group, every reference of ours to it dropped: gloo closes its connections
        only when the group is freed, and that close is what frees peers still waiting on us."""
        group, self._group = self._group, None
        if self._trainee is not None:
            self._trainee.group = None
        return group

    def _abort_group(self) -> None:
        """On the channel's reader thread: abort the group the training thread may be blocked
        in (the group it is about to leave for the directive's)."""
        group = self._group
        if group is not None:
            comm.abort(group)

    def _regroup(self, pending: PendingRegroup) -> None:
        directive = pending.directive
        self._leave()
        launch = self.launch.model_copy(
            update={
                "generation": directive.generation,
                "rank": directive.rank,
                "world_size": directive.world_size,
                "rendezvous": directive.rendezvous,
                "state_source_rank": directive.state_source_rank,
            }
        )
        self.launch = launch
        self._faults.rank = launch.rank
        self._in_handoff = True
        group = self._group = self._join(launch)
        assert group is not None, "a regroup always forms a process group"
        regroup_s = time.perf_counter() - pending.received
        try:
            handoff = hand_off(
                self.replica,
                launch.rank,
                group,
                directive.state_source_rank,
                launch.spec.micro_batches,
                self._store,
            )
        except Exception as exc:
            source = fall_back_to_disk(self.replica, self._store)
            if source is not None and is_peer_failure(exc):
                self._report_regrouped(regroup_s, 0.0, source, 0)
            raise
        self._in_handoff = False
        # resumed_from tells the control plane about recomputation: only a disk state has any.
        resumed = self.replica.next_step - 1 if handoff.source == StateSource.DISK else None
        self._enter(launch, resumed_from=resumed)
        self._report_regrouped(regroup_s, handoff.transfer_s, handoff.source, handoff.reused)
        _log_handoff(launch, handoff, regroup_s)

    def _report_regrouped(
        self, regroup_s: float, transfer_s: float, source: StateSource, reused: int
    ) -> None:
        launch = self.launch
        # A fresh hello first: the agent learns this connection's new generation and rank
        # before any report of them, as it did for the first generation.
        self._channel.send(WorkerHello(**launch.key._asdict()))
        self._channel.send(
            WorkerRegrouped(
                **who(launch.node_id, launch.key),
                pid=os.getpid(),
                world_size=launch.world_size,
                regroup_s=regroup_s,
                state_transfer_s=transfer_s,
                state_source=source,
                resumed_step=self.replica.next_step,
                reused_micro_batches=reused,
            )
        )


def _directive_of(launch: WorkerLaunch) -> RegroupDirective:
    """A joiner's launch as the regroup directive it amounts to: the seat it names."""
    seat = launch.model_dump(include=set(GroupSeat.model_fields))
    return RegroupDirective.model_validate(seat)


def _log_handoff(launch: WorkerLaunch, handoff: Handoff, regroup_s: float) -> None:
    log.info(
        "regrouped",
        generation=launch.generation,
        rank=launch.rank,
        world=launch.world_size,
        source=handoff.source,
        regroup_s=round(regroup_s, 4),
        transfer_s=round(handoff.transfer_s, 4),
        reused=handoff.reused,
        todo=handoff.work.todo,
    )
