"""The lifecycles of jobs, nodes and workers: from each state, the states a record may move to,
each row owned by one service (docs/design.md §9 shows these tables).

``set_state`` on :class:`~unicron.shared.contracts.models.Job`,
:class:`~unicron.shared.contracts.models.NodeRecord` and
:class:`~unicron.shared.contracts.models.WorkerRecord` checks every write against
:data:`JOB_MOVES`, :data:`NODE_MOVES` and :data:`WORKER_MOVES`: a move the table does not list, or
a move by a service that does not own it, is refused (logged, the record left as it was). A
record is created in a state (a job PENDING, by the API on submission or by the executor's
rebuild from the submission event; a node by its agent; a worker by the executor, or by the
rebuild as the agents' inventories and reports show it); that is a new record, not a transition.

The rebuild after Redis lost the records (:mod:`unicron.shared.store.replay`, run by the executor)
restores the job transitions the event stream announced. It checks that each announced move is a
row of the table, but not who announced it (the stream does not say; the NATS permissions of
:mod:`unicron.shared.bus.natsauth` let only the API, the detector and the executor announce one),
nor that it starts from the state the replay reached: an announcement is published after its commit,
so one lost in a crash leaves a gap that the next announcement closes. What the rebuild decides
itself, from the agents' inventories (``services/executor/adopt.py``), it writes as the
executor, checked like any other write.

This module imports nothing of the models (they import it), so the roles live in
:mod:`unicron.shared.contracts.roles`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from unicron.shared.contracts.roles import ServiceRole

S = TypeVar("S", bound=Enum)


class JobState(str, Enum):
    """Lifecycle of a job; :data:`JOB_MOVES` below lists every allowed move and its owner.
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


class NodeState(str, Enum):
    """Lifecycle of a node; :data:`NODE_MOVES` below lists every allowed move and its owner.

    READY → LOST (heartbeats stopped) | QUARANTINED (repeated faults; restored by the rebuild)
    LOST → READY (heard again; a new boot) | QUARANTINED (repeated faults)
    QUARANTINED → READY (cooldown over and heard; a new boot after it) | LOST (cooldown over,
    silent)
    DRAINED is an operator's decision, written by hand: no service moves a node into it. The
    detector's release may also write READY or LOST over a READY, LOST or DRAINED record that
    changed after it decided (a race the table allows, docs/design.md §9).
    """

    READY = "READY"
    LOST = "LOST"
    QUARANTINED = "QUARANTINED"
    DRAINED = "DRAINED"


class WorkerState(str, Enum):
    """Lifecycle of one worker process (one rank of one generation); every move is the
    executor's, from the workers' reports (:data:`WORKER_MOVES`).

    LAUNCHING → RUNNING (process started, or re-formed in place)
    LAUNCHING, RUNNING → SUCCEEDED (exit 0) | FAILED (non-zero exit, signal) | STOPPED (its
    agent stopped it)
    SUCCEEDED, FAILED, STOPPED → SUCCEEDED | FAILED | STOPPED (a later exit report of the rank)
    """

    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


@dataclass(frozen=True)
class Rule(Generic[S]):
    """The record may move from any of ``sources`` to ``target``, made by ``owner`` only."""

    sources: tuple[S, ...]
    target: S
    owner: ServiceRole
    why: str


_P, _S, _R = JobState.PENDING, JobState.STARTING, JobState.RUNNING
_V = JobState.RECOVERING
# Workers of the job's current generation run (or are being started).
ACTIVE = (_S, _R, _V)
_API, _DETECTOR, _EXECUTOR = ServiceRole.API, ServiceRole.DETECTOR, ServiceRole.EXECUTOR
_AGENT = ServiceRole.AGENT

JOB_MOVES: tuple[Rule[JobState], ...] = (
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

_READY, _LOST, _QUARANTINED = NodeState.READY, NodeState.LOST, NodeState.QUARANTINED
_DRAINED = NodeState.DRAINED
# The detector's release (quarantine.py) decides from a listing but writes whatever record it
# finds then, re-checking only an unexpired quarantine: these rows keep that race allowed.
_RACE = "a release written over a record that changed after the review listed it"

NODE_MOVES: tuple[Rule[NodeState], ...] = (
    Rule((_READY,), _LOST, _DETECTOR, "its heartbeats stopped"),
    Rule(
        (_READY, _LOST),
        _QUARANTINED,
        _DETECTOR,
        "`quarantine_threshold` faults of its own within the window",
    ),
    Rule(
        (_QUARANTINED, _LOST),
        _READY,
        _DETECTOR,
        "its cooldown ended and it is heard; its heartbeats resumed",
    ),
    Rule((_QUARANTINED,), _LOST, _DETECTOR, "its cooldown ended while it is silent"),
    Rule((_READY, _DRAINED), _READY, _DETECTOR, _RACE),
    Rule((_READY, _LOST, _DRAINED), _LOST, _DETECTOR, _RACE),
    Rule((_READY,), _QUARANTINED, _EXECUTOR, "the rebuild restores a quarantine still running"),
    Rule(
        (_READY, _LOST, _QUARANTINED),
        _READY,
        _AGENT,
        "a new boot takes the record over (a drain or an unexpired quarantine stays)",
    ),
)

_LAUNCHING, _RUNNING = WorkerState.LAUNCHING, WorkerState.RUNNING
_ENDED = (WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.STOPPED)
# An exit report is applied whatever the rank's record says (progress.py): a redelivered report,
# or the real exit of a rank the rebuild recorded from what it could see, overrides it.
_AGAIN = "a later exit report of the rank overrides the earlier"

WORKER_MOVES: tuple[Rule[WorkerState], ...] = (
    Rule((_LAUNCHING,), _RUNNING, _EXECUTOR, "its process started, or it re-formed in place"),
    Rule((_LAUNCHING, _RUNNING), WorkerState.SUCCEEDED, _EXECUTOR, "it exited 0"),
    Rule(
        (_LAUNCHING, _RUNNING), WorkerState.FAILED, _EXECUTOR, "it exited non-zero or by a signal"
    ),
    Rule((_LAUNCHING, _RUNNING), WorkerState.STOPPED, _EXECUTOR, "its agent stopped it"),
    *(Rule(_ENDED, ended, _EXECUTOR, _AGAIN) for ended in _ENDED),
)


class Lifecycle(Generic[S]):
    """One table of moves, asked who may make a move and why one is refused."""

    def __init__(self, rules: tuple[Rule[S], ...], final: Collection[S] = ()) -> None:
        self.rules = rules
        self.final = frozenset(final)
        self._owners: dict[tuple[S, S], frozenset[ServiceRole]] = {}
        for rule in rules:
            for source in rule.sources:
                move = (source, rule.target)
                self._owners[move] = self._owners.get(move, frozenset()) | {rule.owner}

    def owners(self, old: S, new: S) -> frozenset[ServiceRole]:
        """The services that may move a record from ``old`` to ``new``; empty when none may."""
        return self._owners.get((old, new), frozenset())

    def refusal(self, old: S, new: S, by: ServiceRole | None) -> str | None:
        """Why the move from ``old`` to ``new`` made by ``by`` is not allowed, or None when it
        is. ``by=None`` asks only whether some service may make it (a replayed announcement)."""
        allowed = self.owners(old, new)
        if not allowed:
            if old in self.final:
                return f"{old.value} is terminal"
            return f"no transition {old.value} -> {new.value}"
        if by is not None and by not in allowed:
            names = ", ".join(sorted(r.value for r in allowed))
            return f"{old.value} -> {new.value} is made by {names}, not {by.value}"
        return None


JOBS = Lifecycle(JOB_MOVES, final=[s for s in JobState if s.terminal])
NODES = Lifecycle(NODE_MOVES)
WORKERS = Lifecycle(WORKER_MOVES)
