"""The job lifecycle: from each state, the states a job may move to, each row owned by one
service (docs/design.md §9 shows this table).

:meth:`unicron.shared.contracts.models.Job.set_state` checks every write against
:data:`TRANSITIONS`: a move the table does not list, or a move by a service that does not own it, is
refused (logged, the record left as it was). A record is created PENDING, by the API on submission
or by the executor's rebuild from the submission event; that is a new record, not a transition.

The rebuild after Redis lost the records (:mod:`unicron.shared.store.replay`, run by the executor)
restores the transitions the event stream announced. It checks that each announced move is a row of
the table, but not who announced it (the stream does not say; the NATS permissions of
:mod:`unicron.shared.bus.natsauth` let only the API, the detector and the executor announce one),
nor that it starts from the state the replay reached: an announcement is published after its commit,
so one lost in a crash leaves a gap that the next announcement closes. What the rebuild decides
itself, from the agents' inventories (``services/executor/adopt.py``), it writes as the
executor, checked like any other write.

This module imports nothing of the models (they import it), so the roles live in
:mod:`unicron.shared.contracts.roles`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from unicron.shared.contracts.roles import ServiceRole


class JobState(str, Enum):
    """Lifecycle of a job; :data:`TRANSITIONS` below lists every allowed move and its owner.
    SUCCEEDED, FAILED and CANCELLED are terminal: nothing moves a job out of them."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class Rule:
    """The job may move from any of ``sources`` to ``target``, made by ``owner`` only."""

    sources: tuple[JobState, ...]
    target: JobState
    owner: ServiceRole
    why: str


_P, _S, _R = JobState.PENDING, JobState.STARTING, JobState.RUNNING
_V = JobState.RECOVERING
# Workers of the job's current generation run (or are being started).
ACTIVE = (_S, _R, _V)
_API, _DETECTOR, _EXECUTOR = ServiceRole.API, ServiceRole.DETECTOR, ServiceRole.EXECUTOR

TRANSITIONS: tuple[Rule, ...] = (
    Rule((_P,), _S, _EXECUTOR, "a plan places it"),
    Rule(
        (_S, _V),
        _R,
        _EXECUTOR,
        "its generation's first step; or, for a command that does not use the training API, "
        "every worker started",
    ),
    Rule(
        ACTIVE,
        _V,
        _EXECUTOR,
        "a plan restarts, resizes or moves it; an in-place transition falls back to the "
        "checkpoint; the rebuild finds a rank lost",
    ),
    Rule(ACTIVE, _P, _EXECUTOR, "a plan preempts it (stops its workers)"),
    Rule(ACTIVE, JobState.FAILED, _EXECUTOR, "gave up after `UNICRON_MAX_RECOVERIES` recoveries"),
    Rule(ACTIVE, JobState.SUCCEEDED, _EXECUTOR, "every worker exited 0"),
    Rule(ACTIVE, _V, _DETECTOR, "a failure hit the running generation"),
    Rule(
        ACTIVE,
        JobState.FAILED,
        _DETECTOR,
        "its own code failed more than `max_restarts` times, or its command cannot start",
    ),
    Rule((_P, *ACTIVE), JobState.CANCELLED, _API, "cancelled by its user"),
)


def _by_move(rules: tuple[Rule, ...]) -> dict[tuple[JobState, JobState], frozenset[ServiceRole]]:
    moves: dict[tuple[JobState, JobState], frozenset[ServiceRole]] = {}
    for rule in rules:
        for source in rule.sources:
            moves[source, rule.target] = moves.get((source, rule.target), frozenset()) | {
                rule.owner
            }
    return moves


_OWNERS = _by_move(TRANSITIONS)


def owners(old: JobState, new: JobState) -> frozenset[ServiceRole]:
    """The services that may move a job from ``old`` to ``new``; empty when none may."""
    return _OWNERS.get((old, new), frozenset())


def refusal(old: JobState, new: JobState, by: ServiceRole | None) -> str | None:
    """Why the move from ``old`` to ``new`` made by ``by`` is not allowed, or None when it is.
    ``by=None`` asks only whether some service may make it (a replayed announcement)."""
    allowed = owners(old, new)
    if not allowed:
        if old.terminal:
            return f"{old.value} is terminal"
        return f"no transition {old.value} -> {new.value}"
    if by is not None and by not in allowed:
        names = ", ".join(sorted(r.value for r in allowed))
        return f"{old.value} -> {new.value} is made by {names}, not {by.value}"
    return None
