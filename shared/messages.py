"""Messages between the control plane, node agents and workers (not part of the event stream).

Commands go to one agent on ``unicron.commands.agent.<node_id>`` (stream ``UNICRON_COMMANDS``);
reports come back on ``unicron.reports.<node_id>.<kind>`` (stream ``UNICRON_REPORTS``). Workers
send the same report models to their agent over the local channel, which forwards them as they
are. Every message is a member of a discriminated union, so one ``TypeAdapter`` parses any.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
    model_validator,
)

from shared.models import JobSpec, new_id, now

COMMAND_SUBJECT_PREFIX = "unicron.commands.agent."
REPORT_SUBJECT_PREFIX = "unicron.reports."
DEADLETTER_SUBJECT = "unicron.deadletter"


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- commands: control plane → agent -------------------------------------------------------


class Rendezvous(_Message):
    """Where a generation of a job's workers meet: a TCP store that outlives any worker."""

    host: str
    port: int
    prefix: str


class GroupSeat(_Message):
    """One rank's seat in one generation of a job's process group, and where it meets."""

    job_id: str
    generation: int
    rank: int
    world_size: int
    rendezvous: Rendezvous
    state_source_rank: int | None = Field(
        None, description="take the training state from this live rank of the new group"
    )


class StartWorker(GroupSeat):
    """Launch one rank of one generation; idempotent on (job_id, generation, rank)."""

    kind: Literal["start_worker"] = "start_worker"
    command_id: str = Field(default_factory=lambda: new_id("cmd"))
    spec: JobSpec
    checkpoint_dir: str


class StopWorkers(_Message):
    """Stop a job's workers on this node whose generation is below ``below_generation``
    (all of them when it is None); idempotent."""

    kind: Literal["stop_workers"] = "stop_workers"
    command_id: str = Field(default_factory=lambda: new_id("cmd"))
    job_id: str
    below_generation: int | None = None
    reason: str = ""


class RegroupDirective(GroupSeat):
    """Agent → worker over the local channel: re-form the process group in place under a new
    generation (new store prefix), keeping the process and its memory (DESIGN.md §5)."""

    directive: Literal["regroup"] = "regroup"


class RegroupWorker(_Message):
    """Control plane → agent: hand ``directive`` to the live worker of ``from_generation`` and
    ``from_rank``; idempotent on (job_id, directive.generation, from_rank)."""

    kind: Literal["regroup_worker"] = "regroup_worker"
    command_id: str = Field(default_factory=lambda: new_id("cmd"))
    job_id: str
    from_generation: int
    from_rank: int
    directive: RegroupDirective


class WorkerLaunch(GroupSeat):
    """Everything a worker process needs, passed by its agent in ``UNICRON_WORKER_LAUNCH``."""

    node_id: str
    spec: JobSpec
    checkpoint_dir: str
    agent_socket: str = Field(description="unix socket of the agent's local channel")


class FaultKind(str, Enum):
    """Faults a drill can inject into one worker."""

    CRASH = "crash"  # SIGKILL itself
    EXIT = "exit"  # exit with ``exit_code`` without a report
    EXCEPTION = "exception"  # raise RuntimeError(message) inside the step
    HANG = "hang"  # stop making progress inside the step's compute
    SLOW = "slow"  # multiply this rank's compute time by ``slowdown``


_FIELD_KINDS = {
    "message": FaultKind.EXCEPTION,
    "exit_code": FaultKind.EXIT,
    "slowdown": FaultKind.SLOW,
}


class FaultSpec(_Message):
    """A fault to inject: the body of ``POST /v1/jobs/{id}/faults``."""

    rank: int = Field(ge=0)
    kind: FaultKind
    message: str = Field("injected fault", max_length=4000)
    exit_code: int = Field(1, ge=1, le=255)
    slowdown: float = Field(2.0, gt=1.0, le=100.0)
    at_step: int | None = Field(None, ge=1, description="fire at this step (default: the next)")

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> Self:
        if self.kind != FaultKind.EXCEPTION and "message" in self.model_fields_set:
            raise ValueError("message applies to kind 'exception' only")
        if self.kind != FaultKind.EXIT and "exit_code" in self.model_fields_set:
            raise ValueError("exit_code applies to kind 'exit' only")
        if self.kind != FaultKind.SLOW and "slowdown" in self.model_fields_set:
            raise ValueError("slowdown applies to kind 'slow' only")
        return self

    @model_serializer(mode="wrap")
    def _only_fields_of_kind(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Defaults of other kinds' fields would read back as set and fail the check above.
        data: dict[str, Any] = handler(self)
        for name, kind in _FIELD_KINDS.items():
            if self.kind != kind:
                data.pop(name, None)
        return data


class InjectFault(_Message):
    """Deliver ``fault`` to one worker through its agent's local channel."""

    kind: Literal["inject_fault"] = "inject_fault"
    command_id: str = Field(default_factory=lambda: new_id("cmd"))
    job_id: str
    generation: int
    rank: int
    fault: FaultSpec


class FaultDirective(_Message):
    """What an agent sends a worker over the local channel to inject a fault."""

    directive: Literal["fault"] = "fault"
    fault: FaultSpec


AnyAgentCommand = StartWorker | StopWorkers | InjectFault | RegroupWorker
AgentCommand = Annotated[AnyAgentCommand, Field(discriminator="kind")]
AGENT_COMMAND = TypeAdapter(AgentCommand)


# --- reports: worker / agent → control plane ------------------------------------------------


class _WorkerMessage(_Message):
    node_id: str
    job_id: str
    generation: int
    rank: int
    at: float = Field(default_factory=now)


class WorkerStarted(_WorkerMessage):
    kind: Literal["worker_started"] = "worker_started"
    pid: int


class WorkerExited(_WorkerMessage):
    """A worker process ended; ``signal`` is set when a signal killed it."""

    kind: Literal["worker_exited"] = "worker_exited"
    pid: int
    exit_code: int | None
    signal: int | None = None
    stopped_by_agent: bool = False


class StepCompleted(_WorkerMessage):
    """Per-step telemetry, sent by every rank after its optimizer step."""

    kind: Literal["step_completed"] = "step_completed"
    step: int
    loss: float
    iteration_s: float
    compute_s: float | None = Field(
        None, description="this rank's own compute in the step, without waiting for peers"
    )
    resumed_from: int | None = None


class WorkerHello(_Message):
    """Local channel only: a worker's first line, so its agent can direct it before its first
    report. Not a report: never forwarded to the bus."""

    kind: Literal["hello"] = "hello"
    job_id: str
    generation: int
    rank: int


class WorkerPhase(_WorkerMessage):
    """Local channel only: the worker enters a phase of a step. Lets the agent tell a rank that
    hangs in its own compute from the peers that wait for it in the collective."""

    kind: Literal["worker_phase"] = "worker_phase"
    phase: Literal["compute", "collective", "checkpoint"]
    step: int


class WorkerRegrouped(_WorkerMessage):
    """A worker joined a new generation in place (or as a joiner) and is ready to step."""

    kind: Literal["worker_regrouped"] = "worker_regrouped"
    pid: int
    world_size: int
    regroup_s: float = Field(description="directive received → new process group formed")
    state_transfer_s: float = 0.0
    state_source: Literal["memory", "peer", "checkpoint_memory", "disk", "none"]
    resumed_step: int = Field(description="the step this worker will complete next")
    reused_micro_batches: int = Field(0, description="micro-batches of the interrupted step kept")


class WorkerHung(_WorkerMessage):
    """No step completed for longer than the hang threshold (3 x the running mean)."""

    kind: Literal["worker_hung"] = "worker_hung"
    pid: int
    silent_s: float
    threshold_s: float
    mean_iteration_s: float | None
    process_state: str = Field(description="state letter from /proc: R, S, D, T (stopped) …")
    phase: str | None = None
    last_step: int | None = None


class WorkerException(_WorkerMessage):
    """An exception caught by the worker runtime, reported before the process dies."""

    kind: Literal["worker_exception"] = "worker_exception"
    pid: int
    exc_type: str
    message: str
    category: str
    step: int | None = None


AnyWorkerReport = (
    WorkerStarted
    | WorkerExited
    | StepCompleted
    | WorkerException
    | WorkerPhase
    | WorkerHung
    | WorkerRegrouped
)
WorkerReport = Annotated[AnyWorkerReport, Field(discriminator="kind")]
WORKER_REPORT = TypeAdapter(WorkerReport)


def ping_subject(node_id: str) -> str:
    """Core-NATS request/reply subject an agent answers while its process is alive."""
    return f"unicron.agents.{node_id}.ping"


def command_subject(node_id: str) -> str:
    return COMMAND_SUBJECT_PREFIX + node_id


def report_id(report: AnyWorkerReport) -> str:
    """A stable id, so a report re-sent after a lost acknowledgement is dropped by NATS."""
    base = f"{report.kind}:{report.job_id}:{report.generation}:{report.rank}"
    if isinstance(report, StepCompleted | WorkerPhase):
        return f"{base}:{report.step}"
    if isinstance(report, WorkerRegrouped):
        return f"{base}:{report.resumed_step}"
    if isinstance(report, WorkerHung):
        return f"{base}:{report.last_step}:{report.at:.3f}"
    return f"{base}:{report.pid}"


def report_subject(report: AnyWorkerReport) -> str:
    return f"{REPORT_SUBJECT_PREFIX}{report.node_id}.{report.kind}"


class DeadLetter(_Message):
    """A message no handler could take, kept on ``unicron.deadletter`` for an operator."""

    subject: str
    reason: str
    payload: str
    service: str
    deliveries: int = 1
    at: float = Field(default_factory=now)
