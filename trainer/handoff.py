"""State hand-off when a process group is re-formed: who holds the training state, who needs
it, and which micro-batches of the interrupted step are still to do (docs/design.md §5).

Right after a regroup every rank of the new group all-gathers a short :class:`Holding` —
whether it has trustworthy state, the step it would complete next and the micro-batch indices
of that step it has already summed. :func:`plan_handoff`, a pure function of those holdings,
then decides the same thing on every rank:

- the target step is the furthest one any holder reached (a rank normally lags only if it
  was a few microseconds late in a collective that others completed);
- the state travels by one broadcast from a live peer at that step (the requested source when
  it qualifies, else the lowest such rank) whenever someone lacks it or lags; ranks that are
  already at the target keep their own memory;
- the partial sums of ranks at the target are kept; the micro-batches no one covers are
  dealt out so that each index is counted exactly once, and so that each rank sums what one
  rank of a run without faults sums (:func:`deal`): the step adds up the same float sums,
  not merely the same samples. Rounding matters: a ReLU model trained by Adam turns one
  step's rounding difference into a 0.26 relative difference of its parameters a thousand
  steps later (the MLP of ``bench/user_job.py``);
- when no rank holds state (a group of joiners only), the group resumes from the newest
  checkpoint any rank reaches (:mod:`unicron.trainer.resume`).

The state is whatever the user's run wrapped: its model, optimizer and scheduler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch.distributed as dist
from unicron.shared.contracts.transitions import StateSource
from unicron.shared.logging import get_logger
from unicron.trainer.comm import all_gather_object
from unicron.trainer.parallel import StepWork
from unicron.trainer.replica import Replica
from unicron.trainer.resume import object_device, resume_from_checkpoint
from unicron.trainer.statecast import broadcast_state
from unicron.trainer.storage import CheckpointStore

log = get_logger(component="unicron.trainer.handoff")


@dataclass(frozen=True)
class Holding:
    """What one rank brings into a new group."""

    has_state: bool
    next_step: int
    done: list[int] = field(default_factory=list)
    requested_source: int | None = None


@dataclass(frozen=True)
class HandoffPlan:
    target_step: int
    source: int | None  # rank that broadcasts the state; None: no broadcast
    receivers: frozenset[int]  # ranks that take the broadcast (lacking or lagging)
    kept: dict[int, list[int]]  # rank -> indices of the target step it keeps
    assigned: dict[int, list[int]]  # rank -> indices it still computes
    from_disk: bool = False


@dataclass(frozen=True)
class Handoff:
    """What this rank got out of the hand-off."""

    source: StateSource
    transfer_s: float
    work: StepWork
    reused: int


def holding_of(replica: Replica, requested_source: int | None) -> Holding:
    work = replica.work
    done = list(work.done) if work is not None and work.step == replica.next_step else []
    return Holding(replica.has_state, replica.next_step, done, requested_source)


def plan_handoff(holdings: list[Holding], total: int) -> HandoffPlan:
    """The same plan on every rank, from the all-gathered holdings (see module doc)."""
    world = len(holdings)
    holders = [r for r, h in enumerate(holdings) if h.has_state]
    if not holders:
        assigned = {r: list(range(r, total, world)) for r in range(world)}
        return HandoffPlan(0, 0, frozenset(range(world)), {}, assigned, from_disk=True)
    target = max(holdings[r].next_step for r in holders)
    leaders = [r for r in holders if holdings[r].next_step == target]
    receivers = frozenset(r for r in range(world) if r not in leaders)
    requested = next((h.requested_source for h in holdings if h.requested_source is not None), None)
    source: int | None = None
    if receivers or requested is not None:
        source = requested if requested in leaders else leaders[0]
    kept = {r: holdings[r].done for r in leaders if holdings[r].done}
    return HandoffPlan(target, source, receivers, kept, deal(kept, world, total))


def deal(kept: dict[int, list[int]], world: int, total: int) -> dict[int, list[int]]:
    """The micro-batches of a step that ``kept`` (rank -> indices already summed) does not
    cover, dealt over ``world`` ranks.

    Without faults, rank ``r`` sums the indices ``i % world == r`` in ascending order
    (:func:`unicron.trainer.parallel.micro_batches_for`). Here each such residue class goes whole to
    one rank: the class of a rank's kept indices to that rank, every other class to a rank
    that kept nothing (class ``c`` to rank ``c`` when it is free). Each rank then holds the
    partial sum of one class, summed in the same order, so the all-reduce adds the same terms
    as a run without faults. When kept indices do not fit that (the world size changed
    mid-step), the rest is dealt round-robin: the same update, up to rounding.
    """
    covered = {i for done in kept.values() for i in done}
    remaining = [i for i in range(total) if i not in covered]
    owners = _class_owners(kept, world)
    if owners is None:
        return {r: remaining[r::world] for r in range(world)}
    return {r: [i for i in remaining if owners[i % world] == r] for r in range(world)}


def _class_owners(kept: dict[int, list[int]], world: int) -> list[int] | None:
    """The rank that sums each residue class, by class; None when a rank's kept indices
    span classes or two ranks kept indices of one class."""
    owner: dict[int, int] = {}
    for rank, done in kept.items():
        classes = {i % world for i in done}
        if len(classes) != 1:
            return None
        (cls,) = classes
        if cls in owner:
            return None
        owner[cls] = rank
    free = [r for r in range(world) if r not in owner.values()]
    unowned = [c for c in range(world) if c not in owner]
    for cls in [c for c in unowned if c in free]:  # a rank keeps its own class where it can
        owner[cls] = cls
        free.remove(cls)
    for cls in [c for c in unowned if c not in owner]:
        owner[cls] = free.pop(0)
    return [owner[c] for c in range(world)]


def hand_off(
    replica: Replica,
    rank: int,
    group: dist.ProcessGroup,
    requested_source: int | None,
    total: int,
    store: CheckpointStore,
) -> Handoff:
    """Agree on the state with the new group and bring this rank's ``replica`` to the
    target step; returns the step's work (kept partial sums plus assigned micro-batches)."""
    began = time.perf_counter()
    device = object_device(replica)
    gathered = all_gather_object(holding_of(replica, requested_source), group, device)
    holdings = [h for h in gathered if isinstance(h, Holding)]
    plan = plan_handoff(holdings, total)
    source = StateSource.MEMORY
    if plan.from_disk:
        step = resume_from_checkpoint(replica, rank, group, store)
        source = StateSource.DISK if step > 0 else StateSource.NONE
    elif plan.source is not None:
        state = replica.capture(replica.next_step - 1) if rank == plan.source else None
        received = broadcast_state(state, plan.source, group, device)
        if rank in plan.receivers:
            assert isinstance(received, dict)
            replica.restore(received)
            source = StateSource.PEER
    replica.has_state = True
    replica.next_step = plan.target_step if not plan.from_disk else replica.next_step
    kept = plan.kept.get(rank, [])
    work = _work_for(replica, kept, plan.assigned.get(rank, []))
    replica.work = work
    return Handoff(source, time.perf_counter() - began, work, len(kept))


def _work_for(replica: Replica, kept: list[int], assigned: list[int]) -> StepWork:
    old = replica.work
    if kept and old is not None and old.step == replica.next_step:
        old.todo = list(assigned)
        return old
    # Nothing kept: whatever partial sums .grad holds belong to a step that is over.
    replica.optimizer.zero_grad(set_to_none=True)
    return StepWork(replica.next_step, list(assigned))
