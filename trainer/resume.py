"""Starting from a checkpoint: the newest copy anywhere in the job, the same bits on every rank.

Nodes share no filesystem, and after a restart rank 0 may sit on a node that never had the
newest checkpoint (its old node died). So every rank offers the newest copy it can reach —
its node's, and for rank 0 also the object store's (:class:`unicron.trainer.storage.Offer`) — the
ranks all-gather the offers, the newest wins (a disk copy before a download at the same step,
then the lowest rank), and its holder reads it and broadcasts it. A holder that cannot read
its copy broadcasts nothing, passes that copy over, and the ranks choose again.

With no checkpoint anywhere rank 0 broadcasts its fresh state, as DDP does: a user's model
need not be built identically on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from unicron.shared.contracts.transitions import StateSource
from unicron.shared.logging import get_logger
from unicron.trainer.comm import all_gather_object
from unicron.trainer.replica import Replica
from unicron.trainer.statecast import broadcast_state
from unicron.trainer.storage import CheckpointStore, Offer

log = get_logger(component="unicron.trainer.resume")


def newest_holder(offers: list[Offer | None]) -> int | None:
    """The rank whose offer to take: the newest step, on a disk rather than in object
    storage, then the lowest rank; None when no rank offers anything."""
    ranked = [(offer.step, offer.local, -rank) for rank, offer in enumerate(offers) if offer]
    return -max(ranked)[2] if ranked else None


def resume_from_checkpoint(
    replica: Replica, rank: int, group: dist.ProcessGroup | None, store: CheckpointStore
) -> int:
    """Bring every rank of ``group`` to the job's newest checkpoint (see module doc); returns
    its step, 0 for none. ``group=None`` is a single process with no one to ask or tell."""
    # Before the all-gather, which no rank leaves before every rank is past this: no rank of
    # the new run can have claimed a step yet.
    store.forget_unfinished_claims()
    passed_over: set[Offer] = set()
    while True:
        offer = store.offer(passed_over, remote=rank == 0)
        holder = newest_holder(_all_gather(offer, group, object_device(replica)))
        if holder is None:
            return _start_fresh(replica, rank, group)
        state = store.load(offer) if rank == holder and offer is not None else None
        received: object = state
        if group is not None:
            received = broadcast_state(state, holder, group, object_device(replica))
        if isinstance(received, dict):
            step = replica.restore(received)
            replica.has_state = True
            replica.next_step = step + 1
            log.info("resumed", rank=rank, step=step, holder=holder)
            return step
        if rank == holder and offer is not None:
            log.warning("checkpoint unreadable; passed over", step=offer.step, local=offer.local)
            passed_over.add(offer)


def _all_gather(
    offer: Offer | None, group: dist.ProcessGroup | None, device: torch.device
) -> list[Offer | None]:
    if group is None:
        return [offer]
    gathered = all_gather_object(offer, group, device)
    return [item if isinstance(item, Offer) else None for item in gathered]


def _start_fresh(replica: Replica, rank: int, group: dist.ProcessGroup | None) -> int:
    if group is not None:
        mine = replica.capture(0) if rank == 0 else None
        received = broadcast_state(mine, 0, group, object_device(replica))
        if rank != 0 and isinstance(received, dict):
            replica.restore(received)
    replica.has_state = True
    replica.next_step = 1
    return 0


def fall_back_to_disk(replica: Replica, store: CheckpointStore) -> StateSource | None:
    """After a failed transfer: a rank without state takes the newest checkpoint it reaches
    alone — its node's or the object store's (the group is broken, so no peer can send one);
    a rank with state keeps its newer memory. Returns the source used, None if it kept."""
    if replica.has_state:
        return None
    found = store.load_newest()
    replica.has_state = True
    replica.work = None
    if found is None:
        replica.next_step = 1  # the freshly built model is the state of step 0
        return StateSource.NONE
    step, state = found
    replica.restore(state)
    replica.next_step = step + 1
    log.warning("state from disk after a failed transfer", step=step)
    return StateSource.DISK


def object_device(replica: Replica) -> torch.device:
    device = next(replica.model.parameters()).device
    # Object collectives stage their bytes on the device NCCL needs; gloo works on the CPU.
    return device if device.type == "cuda" else torch.device("cpu")
