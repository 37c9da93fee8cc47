"""State records kept in Redis: jobs, their workers, nodes.

Each record has exactly one pydantic model here (plans have theirs in
:mod:`unicron.shared.contracts.plans`); services read and write them only through
:mod:`unicron.shared.store.state`. Lifecycle states are ``str`` enums whose docstrings give the
allowed transitions, so a reader of a record in Redis knows what may come next; they are tables in
:mod:`unicron.shared.contracts.lifecycle`, with the service that owns each move, and each record's
``set_state`` is the only way its state changes, enforcing its table.
"""

from __future__ import annotations

import time
import uuid
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field
from unicron.shared.contracts.jobspec import JobSpec as JobSpec
from unicron.shared.contracts.jobspec import ModelConfig as ModelConfig
from unicron.shared.contracts.lifecycle import JOBS, NODES, WORKERS
from unicron.shared.contracts.lifecycle import JobState as JobState
from unicron.shared.contracts.lifecycle import NodeState as NodeState
from unicron.shared.contracts.lifecycle import WorkerState as WorkerState
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind, RecoveryAction, Severity
from unicron.shared.contracts.transitions import PlanAction as PlanAction
from unicron.shared.contracts.transitions import StateSource, TransitionMode
from unicron.shared.logging import get_logger


def now() -> float:
    """Wall-clock UNIX seconds; every timestamp in a record or event uses this clock."""
    return time.time()


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _refused(
    record: str, old: Enum, new: Enum, by: ServiceRole | None, why: str, reason: str, **ids: object
) -> None:
    get_logger(**ids).error(
        f"{record} state transition refused",
        old=old.value,
        new=new.value,
        by=by.value if by is not None else "replay",
        why=why,
        reason=reason,
    )


class WorkerRecord(BaseModel):
    rank: int
    node_id: str
    pid: int | None = None
    state: WorkerState = WorkerState.LAUNCHING
    exit_code: int | None = None
    from_generation: int | None = Field(
        None, description="a survivor re-formed in place: the generation it came from"
    )
    from_rank: int | None = Field(None, description="a survivor's rank in ``from_generation``")
    state_source_rank: int | None = Field(
        None, description="the rank of this generation that broadcasts the training state"
    )
    regrouped_at: float | None = Field(None, description="when it reported WorkerRegrouped")
    state_source: StateSource | None = Field(None, description="where its training state came from")
    state_transfer_s: float | None = None
    resumed_step: int | None = None

    @property
    def survivor(self) -> bool:
        return self.from_generation is not None

    def set_state(self, state: WorkerState, reason: str, by: ServiceRole, job_id: str) -> bool:
        """Move to ``state`` as the service ``by``, if the lifecycle's :data:`WORKER_MOVES
        <unicron.shared.contracts.lifecycle.WORKER_MOVES>` allows it. False when the state did
        not change: already there (a re-entry the table lists), or the move is refused (logged
        with ``job_id``, the record unchanged). The record keeps no history: ``reason`` is
        for the log."""
        why = WORKERS.refusal(self.state, state, by)
        if why is not None:
            ids = {"job_id": job_id, "node_id": self.node_id, "rank": self.rank}
            _refused("worker", self.state, state, by, why, reason, **ids)
            return False
        if self.state == state:
            return False
        self.state = state
        return True


class HistoryEntry(BaseModel):
    at: float = Field(default_factory=now)
    state: JobState
    reason: str


FOLLOWS_JOB = "it came back after a restart, on another node: the job's own, not a node's"


class FailureRecord(BaseModel):
    """The last failure that hit a job; a job needs a transition while ``generation`` is current."""

    failure_id: str
    generation: int
    kind: FailureKind
    category: FailureCategory
    severity: Severity
    action: RecoveryAction
    rank: int | None = None
    node_id: str | None = None
    observed_at: float
    detected_at: float | None = Field(None, description="when failure.detected was published")
    step: int | None = Field(None, description="the job's last completed step when it failed")
    exc_type: str | None = Field(None, description="the exception a worker reported or wrote")
    message: str | None = Field(None, description="its text (the last lines of its chain)")
    at: float | None = Field(None, description="when it was observed (as observed_at)")
    follows_job: bool = Field(False, description=FOLLOWS_JOB)


class JobBase(BaseModel):
    """What a job is and where it stands, without its per-worker records and history: the
    part whose size does not grow with the job's ranks."""

    id: str
    name: str
    spec: JobSpec
    tenant: str | None = Field(None, description="who submitted it, when API tokens are in use")
    state: JobState = JobState.PENDING
    step: int = 0
    loss: float | None = None
    generation: int = 0
    world_size: int = 0
    recoveries: int = 0
    code_failures: int = Field(
        0,
        description="failures of the job's own (its code's, or ones that followed it), "
        "against max_restarts",
    )
    last_failure: FailureRecord | None = None
    plan_id: str | None = None
    transition: PlanAction | None = Field(None, description="the transition under way, if any")
    transition_kind: TransitionMode | None = Field(
        None, description="in_place: survivors re-form, joiners get their state from a peer"
    )
    stepping: bool = Field(False, description="the current generation has completed a step")
    transition_fallback: str | None = Field(
        None, description="why the in-place transition was abandoned for a checkpoint restart"
    )
    submitted_at: float = Field(default_factory=now)
    transition_started_at: float | None = None

    def needs_recovery(self) -> bool:
        """True while the last failure hit the generation that is running now."""
        return (
            not self.state.terminal
            and self.last_failure is not None
            and self.last_failure.generation == self.generation
            and self.generation > 0
        )


class JobSummary(JobBase):
    """A job as ``GET /v1/jobs`` lists it: its record without workers and history, so a page
    costs the same for a job of 8 ranks and one of 8,192; ``GET /v1/jobs/{id}`` has the rest."""

    reason: str = Field("", description="why the job is in its state (its last history entry)")
    state_since: float = Field(description="when the job entered its state")
    failed_ranks: int = Field(0, description="workers of the current generation that failed")
    launching_ranks: int = Field(0, description="workers asked to start that have not yet")


class Job(JobBase):
    """A job as kept in Redis and returned by ``GET /v1/jobs/{id}``."""

    workers: list[WorkerRecord] = Field(default_factory=list)
    history: list[HistoryEntry] = Field(default_factory=list)
    step_generation: int = Field(0, description="the generation whose rank 0 reported ``step``")

    def answered_failure(self) -> FailureRecord | None:
        """The failure the current generation was started to recover from, or None (a start, a
        resize, a failure not yet answered). It is the generation after the failure's, or the
        one after that where the in-place answer fell back to restarting every rank."""
        lag = 2 if self.transition_fallback else 1
        failure = self.last_failure
        return (
            failure if failure is not None and failure.generation == self.generation - lag else None
        )

    def entered(self) -> HistoryEntry | None:
        """The history entry that moved the job into its present state."""
        return next((e for e in reversed(self.history) if e.state == self.state), None)

    def summary(self) -> JobSummary:
        entry = self.entered()
        fields: dict[str, Any] = {name: getattr(self, name) for name in JobBase.model_fields}
        fields["failed_ranks"] = sum(w.state == WorkerState.FAILED for w in self.workers)
        fields["launching_ranks"] = sum(w.state == WorkerState.LAUNCHING for w in self.workers)
        if entry is None:
            return JobSummary(**fields, state_since=self.submitted_at)
        return JobSummary(**fields, reason=entry.reason, state_since=entry.at)

    def set_state(self, state: JobState, reason: str, by: ServiceRole) -> bool:
        """Move to ``state`` as the service ``by`` and record why, if
        :mod:`unicron.shared.contracts.lifecycle` allows it. False when the state did not change:
        the job was already there (a re-entry the table lists, such as a new failure while
        RECOVERING; the caller records
        it if it means a new attempt), or the move is refused (logged, the record unchanged)."""
        return self._move(state, reason, by, source=self.state, at=None)

    def replay_state(self, announced: JobState, state: JobState, reason: str, at: float) -> bool:
        """Restore a move from ``announced`` to ``state`` that the event stream recorded (the
        rebuild of :mod:`unicron.shared.store.replay`): it must be a row of the lifecycle table,
        whoever made
        it, but may start from a state whose announcement was lost. A finished job stays
        finished. False when the state did not change."""
        source = self.state if self.state.terminal else announced
        return self._move(state, reason, None, source=source, at=at)

    def _move(
        self,
        state: JobState,
        reason: str,
        by: ServiceRole | None,
        source: JobState,
        at: float | None,
    ) -> bool:
        why = JOBS.refusal(source, state, by)
        if why is not None:
            _refused("job", self.state, state, by, why, reason, job_id=self.id)
            return False
        if self.state == state:
            return False
        self.state = state
        self.history.append(
            HistoryEntry(at=now() if at is None else at, state=state, reason=reason)
        )
        return True


class NodeWorker(BaseModel):
    """One worker process a node's agent runs, as its last heartbeat saw it: the control plane
    re-adopts it, or stops it, after Redis lost the job records (docs/design.md §6)."""

    job_id: str
    generation: int = Field(ge=0, description="the generation it runs now (after a regroup)")
    rank: int = Field(ge=0)
    pid: int


class NodeRecord(BaseModel):
    """A node as its agent registered it, and as ``GET /v1/nodes`` shows it."""

    id: str
    state: NodeState = NodeState.READY
    slots: int = Field(ge=0, description="workers at once: on a GPU node at most one per GPU")
    gpus: int = Field(0, ge=0, description="GPUs its agent found; 0 on a node without CUDA")
    retired_gpus: dict[str, str] = Field(
        default_factory=dict,
        description="GPUs its agent stopped handing out after a fault, by device: the fault; "
        "each is a slot fewer until the agent restarts",
    )
    used: int = 0
    last_heartbeat: float = Field(default_factory=now)
    host: str = "127.0.0.1"
    store_port: int = 0
    boot_id: str = ""
    quarantined_until: float | None = None
    spares_ready: int = Field(0, description="warm spare workers waiting on the node")
    workers: list[NodeWorker] = Field(
        default_factory=list, description="the worker processes its agent runs, by heartbeat"
    )

    def set_state(self, state: NodeState, reason: str, by: ServiceRole) -> bool:
        """Move to ``state`` as the service ``by``, if the lifecycle's :data:`NODE_MOVES
        <unicron.shared.contracts.lifecycle.NODE_MOVES>` allows it. False when the state did not
        change: already there (a re-entry the table lists), or the move is refused (logged with
        the node id, the record unchanged). The record keeps no history: ``reason`` is for the
        log; the caller announces the change."""
        why = NODES.refusal(self.state, state, by)
        if why is not None:
            _refused("node", self.state, state, by, why, reason, node_id=self.id)
            return False
        if self.state == state:
            return False
        self.state = state
        return True

    def silent_s(self, at: float, heard_since: float = 0.0) -> float:
        """Seconds without a heartbeat at ``at``, counted from ``heard_since`` at the earliest:
        when the observer could first have heard one (see :mod:`unicron.shared.store.hearing`)."""
        return at - max(self.last_heartbeat, heard_since)
