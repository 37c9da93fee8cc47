"""The vocabulary of a job's transitions, and the one map between its four views of one.

A failure calls for a :class:`~unicron.shared.contracts.taxonomy.RecoveryAction` (the detector); the
planner prices each worker count it could give a job as a :class:`TransitionKind` and names the
job's :class:`PlanAction`; the executor carries a launch out in a :class:`TransitionMode`, in place
or from the checkpoint; each new rank reports the :class:`StateSource` its state came from.
:data:`CARRIED_BY_KIND` says which goes with which, for each kind of transition (the table of
docs/design.md §5); code that needs one of these from another asks the helpers below rather than
listing members of its own.

Every value is the string that travels on the bus and lies in Redis.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

from unicron.shared.contracts.taxonomy import RecoveryAction


class StateSource(str, Enum):
    """Where a rank's training state came from, from no state at all to the farthest copy.

    The declaration order is the distance: a transition is named by the farthest source any of
    its ranks used (:meth:`farthest`), so one rank that read the disk makes it a disk recovery.
    """

    NONE = "none"  # nothing restored: a fresh start, or no checkpoint to read
    MEMORY = "memory"  # the rank kept its own
    PEER = "peer"  # one broadcast from a healthy data-parallel replica
    CHECKPOINT_MEMORY = "checkpoint_memory"  # a checkpoint still held in memory
    DISK = "disk"  # the last checkpoint on disk

    @property
    def distance(self) -> int:
        return _SOURCE_ORDER.index(self)

    @staticmethod
    def farthest(sources: Iterable[StateSource]) -> StateSource | None:
        """The source that names a transition whose ranks used ``sources``; None for none."""
        return max(sources, key=lambda source: source.distance, default=None)


_SOURCE_ORDER: Final = tuple(StateSource)


class TransitionKind(str, Enum):
    """How a job gets from what it runs to a worker count a plan could give it (the planner's
    pricing, :mod:`unicron.planning.costs`)."""

    NONE = "none"  # nothing changes: it keeps running, or keeps waiting
    START = "start"  # first launch
    RESUME = "resume"  # launch again from its checkpoint after a preemption
    REATTEMPT = "reattempt"  # retry the failed collective in place (SEV3)
    RESTART = "restart"  # replace the failed processes, same size and nodes (SEV2)
    SHRINK = "shrink"  # survivors re-form without some ranks
    GROW = "grow"  # new ranks join, fetching state from a peer
    MIGRATE = "migrate"  # ranks on lost nodes are replaced elsewhere
    STOP = "stop"  # preempted back to waiting


class PlanAction(str, Enum):
    """What the executor must do for one job to reach the plan."""

    KEEP = "keep"
    START = "start"
    RESTART = "restart"
    RESIZE = "resize"
    STOP = "stop"
    WAIT = "wait"


class TransitionMode(str, Enum):
    """How the executor runs a job's new generation (``Job.transition_kind``)."""

    IN_PLACE = "in_place"  # survivors re-form, joiners get their state from a peer
    CHECKPOINT = "checkpoint"  # every rank starts afresh, from the checkpoint if there is one


@dataclass(frozen=True)
class Carried:
    """How one kind of transition is asked for and carried out.

    ``plan``: the plan actions that carry it; ``modes``: how the executor may run it (empty: no
    new generation starts); ``answers``: the failure actions it answers when the job stays on
    its own nodes and size.
    """

    plan: frozenset[PlanAction]
    modes: frozenset[TransitionMode] = frozenset()
    answers: frozenset[RecoveryAction] = frozenset()


def _row(
    plan: Iterable[PlanAction],
    modes: Iterable[TransitionMode] = (),
    answers: Iterable[RecoveryAction] = (),
) -> Carried:
    return Carried(frozenset(plan), frozenset(modes), frozenset(answers))


_P, _M, _R = PlanAction, TransitionMode, RecoveryAction
# A launch into a running job keeps its survivors in place where it can; otherwise (no
# survivor, a job that never stepped, an in-place attempt that failed) every rank restarts.
_EITHER = (_M.IN_PLACE, _M.CHECKPOINT)
# A failure is answered with PlanAction.RESTART at whatever size the plan gives the job.
_RESIZING = (_P.RESTART, _P.RESIZE)

CARRIED_BY_KIND: Final[Mapping[TransitionKind, Carried]] = {
    TransitionKind.NONE: _row((_P.KEEP, _P.WAIT), answers=(_R.REPORT,)),
    TransitionKind.START: _row((_P.START,), (_M.CHECKPOINT,)),
    TransitionKind.RESUME: _row((_P.START,), (_M.CHECKPOINT,)),
    TransitionKind.REATTEMPT: _row((_P.RESTART,), _EITHER, (_R.REATTEMPT,)),
    TransitionKind.RESTART: _row((_P.RESTART,), _EITHER, (_R.RESTART, _R.RECONFIGURE)),
    TransitionKind.SHRINK: _row(_RESIZING, _EITHER),
    TransitionKind.GROW: _row(_RESIZING, _EITHER),
    TransitionKind.MIGRATE: _row(_RESIZING, _EITHER),
    TransitionKind.STOP: _row((_P.STOP,)),
}


def kinds_of(action: PlanAction) -> frozenset[TransitionKind]:
    """The kinds of transition a plan action may carry out."""
    return frozenset(kind for kind, row in CARRIED_BY_KIND.items() if action in row.plan)


def modes_of(action: PlanAction) -> frozenset[TransitionMode]:
    """How the executor may run a plan action's new generation (empty: it starts none)."""
    return frozenset(mode for kind in kinds_of(action) for mode in CARRIED_BY_KIND[kind].modes)


def answer_to(action: RecoveryAction) -> TransitionKind:
    """The transition a failure that calls for ``action`` takes on the job's own nodes and size."""
    return _ANSWERS[action]


_ANSWERS: Final = {action: kind for kind, row in CARRIED_BY_KIND.items() for action in row.answers}
# Plan actions that start a new generation of the job's workers.
LAUNCHES: Final = frozenset(action for action in PlanAction if modes_of(action))
# Plan actions whose new generation may keep the survivors' processes.
IN_PLACE_ACTIONS: Final = frozenset(
    action for action in PlanAction if TransitionMode.IN_PLACE in modes_of(action)
)
# Plan actions that ask the executor for nothing: alone, they do not make a plan news.
QUIET: Final = frozenset(
    action for action in PlanAction if kinds_of(action) == {TransitionKind.NONE}
)
