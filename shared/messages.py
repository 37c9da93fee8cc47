"""Messages between the control plane, node agents and workers (not part of the event stream).

Commands go to one agent on ``unicron.commands.agent.<node_id>`` (stream ``UNICRON_COMMANDS``);
reports come back on ``unicron.reports.<node_id>.<kind>`` (stream ``UNICRON_REPORTS``). Workers
send the same report models to their agent over the local channel, which forwards them as they
are. Every message is a member of a discriminated union, so one ``TypeAdapter`` parses any.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

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


class StartWorker(_Message):
    """Launch one rank of one generation; idempotent on (job_id, generation, rank)."""

    kind: Literal["start_worker"] = "start_worker"
    command_id: str = Field(default_factory=lambda: new_id("cmd"))
    job_id: str
    generation: int
    rank: int
    world_size: int
    spec: JobSpec
    rendezvous: Rendezvous
    checkpoint_dir: str


class StopWorkers(_Message):
    """Stop a job's workers on this node whose generation is below ``below_generation``
    (all of them when it is None); idempotent."""

    kind: Literal["stop_workers"] = "stop_workers"
    command_id: str = Field(default_factory=lambda: new_id("cmd"))
    job_id: str
    below_generation: int | None = None
    reason: str = ""


class WorkerLaunch(_Message):
    """Everything a worker process needs, passed by its agent in ``UNICRON_WORKER_LAUNCH``."""

    node_id: str
    job_id: str
    generation: int
    rank: int
    world_size: int
    spec: JobSpec
    rendezvous: Rendezvous
    checkpoint_dir: str
    agent_socket: str = Field(description="unix socket of the agent's local channel")


AgentCommand = Annotated[StartWorker | StopWorkers, Field(discriminator="kind")]
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
    resumed_from: int | None = None


class WorkerException(_WorkerMessage):
    """An exception caught by the worker runtime, reported before the process dies."""

    kind: Literal["worker_exception"] = "worker_exception"
    pid: int
    exc_type: str
    message: str
    category: str
    step: int | None = None


WorkerReport = Annotated[
    WorkerStarted | WorkerExited | StepCompleted | WorkerException, Field(discriminator="kind")
]
WORKER_REPORT = TypeAdapter(WorkerReport)


def command_subject(node_id: str) -> str:
    return COMMAND_SUBJECT_PREFIX + node_id


def report_id(report: WorkerStarted | WorkerExited | StepCompleted | WorkerException) -> str:
    """A stable id, so a report re-sent after a lost acknowledgement is dropped by NATS."""
    base = f"{report.kind}:{report.job_id}:{report.generation}:{report.rank}"
    return f"{base}:{report.step}" if isinstance(report, StepCompleted) else f"{base}:{report.pid}"


def report_subject(report: WorkerStarted | WorkerExited | StepCompleted | WorkerException) -> str:
    return f"{REPORT_SUBJECT_PREFIX}{report.node_id}.{report.kind}"


class DeadLetter(_Message):
    """A message no handler could take, kept on ``unicron.deadletter`` for an operator."""

    subject: str
    reason: str
    payload: str
    service: str
    deliveries: int = 1
    at: float = Field(default_factory=now)
