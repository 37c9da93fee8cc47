"""The event stream: CloudEvents 1.0 envelopes around one pydantic model per event type.

Every event is published on ``unicron.events.<type>`` and kept in the JetStream stream
``UNICRON_EVENTS``; its CloudEvents ``id`` doubles as the ``Nats-Msg-Id`` so a re-published
event is dropped by the server.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from unicron.shared.contracts.models import (
    FOLLOWS_JOB,
    FailureRecord,
    Job,
    JobSpec,
    JobState,
    NodeState,
    PlanAction,
    new_id,
    now,
)
from unicron.shared.contracts.taxonomy import (
    FailureCategory,
    FailureKind,
    RecoveryAction,
    Severity,
    severity_of,
)
from unicron.shared.contracts.transitions import StateSource, TransitionMode

EVENT_SUBJECT_PREFIX = "unicron.events."


def event_subject(event_type: str) -> str:
    """The subject an event of ``event_type`` (an event model's ``TYPE``) is published on."""
    return EVENT_SUBJECT_PREFIX + event_type


class EventData(BaseModel):
    """Base of every event's ``data``; ``TYPE`` is the CloudEvents type."""

    model_config = ConfigDict(extra="forbid")
    TYPE: ClassVar[str]

    def default_id(self) -> str:
        """A deterministic id where the event is a fact that must be recorded once."""
        return new_id(self.TYPE)


class JobSubmitted(EventData):
    TYPE: ClassVar[str] = "job.submitted"
    job_id: str
    name: str
    spec: JobSpec
    tenant: str | None = Field(None, description="who submitted it, when API tokens are in use")

    def default_id(self) -> str:
        return f"{self.TYPE}:{self.job_id}"


class JobStateChanged(EventData):
    TYPE: ClassVar[str] = "job.state_changed"
    job_id: str
    old: JobState
    new: JobState
    reason: str
    step: int = 0
    generation: int = 0

    def default_id(self) -> str:
        return f"{self.TYPE}:{self.job_id}:{self.generation}:{self.old.value}:{self.new.value}"

    @classmethod
    def between(
        cls, old: Job | JobState, new: Job, reason: str | None = None
    ) -> JobStateChanged | None:
        """The event for a change of ``old`` (the job before, or the state it was in) into
        ``new``; None when the state is the same. The reason is ``new``'s last move's unless
        given (a repeated cancel names the cancel, whatever the history ends with)."""
        before = old.state if isinstance(old, Job) else old
        if before == new.state:
            return None
        if reason is None:
            reason = new.history[-1].reason if new.history else ""
        return cls(
            job_id=new.id,
            old=before,
            new=new.state,
            reason=reason,
            step=new.step,
            generation=new.generation,
        )


class FailureDetected(EventData):
    TYPE: ClassVar[str] = "failure.detected"
    failure_id: str
    job_id: str | None
    node_id: str | None
    rank: int | None
    generation: int = 0
    kind: FailureKind
    category: FailureCategory
    severity: Severity
    action: RecoveryAction
    observed_at: float
    detected_at: float = Field(default_factory=now)
    evidence: dict[str, Any] = Field(default_factory=dict)
    exc_type: str | None = Field(None, description="the exception behind it, when one was seen")
    message: str | None = Field(None, description="the exception's text")
    follows_job: bool = Field(False, description=FOLLOWS_JOB)

    def default_id(self) -> str:
        return f"{self.TYPE}:{self.failure_id}"

    @classmethod
    def of(
        cls,
        category: FailureCategory,
        *,
        graded: tuple[Severity, RecoveryAction] | None = None,
        **fields: Any,
    ) -> FailureDetected:
        """A failure of ``category``, as severe and answered as the taxonomy says unless the
        detector ``graded`` it otherwise (escalated, or no rank left to reattempt)."""
        severity, action = graded or severity_of(category)
        return cls(category=category, severity=severity, action=action, **fields)

    def record(self, step: int | None) -> FailureRecord:
        """The job's ``last_failure`` for this failure, hit at the job's ``step``."""
        return FailureRecord(
            failure_id=self.failure_id,
            generation=self.generation,
            kind=self.kind,
            category=self.category,
            severity=self.severity,
            action=self.action,
            rank=self.rank,
            node_id=self.node_id,
            observed_at=self.observed_at,
            detected_at=self.detected_at,
            step=step,
            exc_type=self.exc_type,
            message=self.message,
            at=self.observed_at,
            follows_job=self.follows_job,
        )


class PlannedJob(BaseModel):
    job_id: str
    action: PlanAction
    workers: int
    previous_workers: int


class PlanCreated(EventData):
    TYPE: ClassVar[str] = "plan.created"
    plan_id: str
    seq: int
    epoch: int
    trigger: str
    expected_waf: float
    jobs: list[PlannedJob]

    def default_id(self) -> str:
        return f"{self.TYPE}:{self.plan_id}"


class TransitionStarted(EventData):
    TYPE: ClassVar[str] = "transition.started"
    job_id: str
    plan_id: str
    action: PlanAction
    generation: int
    from_workers: int
    to_workers: int
    kind: TransitionMode | None = Field(
        None, description="in_place: survivors re-form; checkpoint: every rank restarts"
    )

    def default_id(self) -> str:
        return f"{self.TYPE}:{self.job_id}:{self.generation}"


class TransitionCompleted(EventData):
    TYPE: ClassVar[str] = "transition.completed"
    job_id: str
    action: PlanAction
    generation: int
    world_size: int
    resumed_step: int
    downtime_s: float | None = Field(
        None, description="failure observed → first completed step of the new generation"
    )
    duration_s: float = Field(description="transition started → first completed step")
    kind: TransitionMode | None = Field(None, description="in_place or checkpoint")
    state_source: StateSource | None = Field(
        None, description="where the state came from: memory, peer, checkpoint_memory, disk, none"
    )
    phases: dict[str, float] = Field(
        default_factory=dict,
        description="seconds of detect, plan, regroup, state_transfer, first_step",
    )
    fallback: str | None = Field(None, description="why an in-place transition was abandoned")

    def default_id(self) -> str:
        return f"{self.TYPE}:{self.job_id}:{self.generation}"


class NodeJoined(EventData):
    TYPE: ClassVar[str] = "node.joined"
    node_id: str
    slots: int
    host: str
    boot_id: str

    def default_id(self) -> str:
        return f"{self.TYPE}:{self.node_id}:{self.boot_id}"


class NodeLost(EventData):
    TYPE: ClassVar[str] = "node.lost"
    node_id: str
    boot_id: str
    last_heartbeat: float

    def default_id(self) -> str:
        return f"{self.TYPE}:{self.node_id}:{self.boot_id}:{self.last_heartbeat:.3f}"


class NodeStateChanged(EventData):
    """A node moved between states: repaired (LOST → READY), quarantined, quarantine ended…"""

    TYPE: ClassVar[str] = "node.state_changed"
    node_id: str
    old: NodeState
    new: NodeState
    reason: str = ""
    at: float = Field(default_factory=now)
    until: float | None = Field(None, description="when a quarantine ends (new: QUARANTINED)")

    def default_id(self) -> str:
        return f"{self.TYPE}:{self.node_id}:{self.old.value}:{self.new.value}:{self.at:.3f}"


EVENT_TYPES: dict[str, type[EventData]] = {
    cls.TYPE: cls
    for cls in (
        JobSubmitted,
        JobStateChanged,
        FailureDetected,
        PlanCreated,
        TransitionStarted,
        TransitionCompleted,
        NodeJoined,
        NodeLost,
        NodeStateChanged,
    )
}


class CloudEvent(BaseModel):
    """CloudEvents 1.0 structured-mode JSON envelope."""

    model_config = ConfigDict(extra="allow")

    specversion: str = "1.0"
    id: str
    source: str
    type: str
    time: str
    datacontenttype: str = "application/json"
    subject: str | None = None
    data: dict[str, Any]

    @classmethod
    def wrap(cls, data: EventData, source: str, event_id: str | None = None) -> CloudEvent:
        return cls(
            id=event_id or data.default_id(),
            source=source,
            type=data.TYPE,
            time=datetime.now(UTC).isoformat(),
            subject=getattr(data, "job_id", None) or getattr(data, "node_id", None),
            data=data.model_dump(mode="json"),
        )

    @property
    def nats_subject(self) -> str:
        return event_subject(self.type)

    def typed(self) -> EventData:
        """The ``data`` as its event model; raises ``KeyError`` or ``ValidationError`` if bad."""
        return EVENT_TYPES[self.type].model_validate(self.data)
