"""Messages between the control plane, node agents and workers (not part of the event stream).

This module holds the downward direction and what both directions share: commands go to one
agent on ``unicron.commands.agent.<node_id>`` (stream ``UNICRON_COMMANDS``); the agent passes
a worker its directives over the local channel in the models of
:mod:`unicron.shared.contracts.workerchannel` (``RegroupDirective`` lives here because
``RegroupWorker`` carries it). Reports come back in the models of
:mod:`unicron.shared.contracts.reports`. Every command is a member of a discriminated union, so one
``TypeAdapter`` parses any; a message no handler could take is a ``DeadLetter``.
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
from unicron.shared.contracts.identity import JobRank
from unicron.shared.contracts.models import new_id, now

COMMAND_SUBJECT_PREFIX = "unicron.commands.agent."
DEADLETTER_SUBJECT = "unicron.deadletter"


class Message(BaseModel):
    """Base of every command, directive and report: an unknown field is an error."""

    model_config = ConfigDict(extra="forbid")


# --- commands: control plane → agent -------------------------------------------------------


class Rendezvous(Message):
    """Where a generation of a job's workers meet: a TCP store that outlives any worker."""

    host: str
    port: int
    prefix: str


class GroupSeat(JobRank, Message):
    """One rank's seat in one generation of a job's process group, and where it meets."""

    world_size: int
    rendezvous: Rendezvous
    state_source_rank: int | None = Field(
        None, description="take the training state from this live rank of the new group"
    )


class StartWorker(GroupSeat):
    """Launch one rank of one generation; idempotent on (job_id, generation, rank).

    It names the job, never what to run or where: the agent reads the spec from the job record
    the API accepted and derives every path under its own data directory, so nothing on the bus
    becomes a command line or a place to write. The placement fields are what torchrun calls
    LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK.
    """

    kind: Literal["start_worker"] = "start_worker"
    command_id: str = Field(default_factory=lambda: new_id("cmd"))
    local_rank: int = Field(0, ge=0, description="its index among the job's ranks on the node")
    local_world_size: int = Field(1, ge=1, description="the job's ranks on the node")
    group_rank: int = Field(0, ge=0, description="the node's index among the job's nodes")


class StopWorkers(Message):
    """Stop a job's workers on this node whose generation is below ``below_generation``
    (all of them when it is None); idempotent."""

    kind: Literal["stop_workers"] = "stop_workers"
    command_id: str = Field(default_factory=lambda: new_id("cmd"))
    job_id: str
    below_generation: int | None = None
    reason: str = ""


class RegroupDirective(GroupSeat):
    """Agent → worker over the local channel: re-form the process group in place under a new
    generation (new store prefix), keeping the process and its memory (docs/design.md §5)."""

    directive: Literal["regroup"] = "regroup"
    lost_hosts: list[str] = Field(
        default_factory=list,
        description="addresses of lost nodes: the worker severs its connections to them",
    )


class RegroupWorker(Message):
    """Control plane → agent: hand ``directive`` to the live worker of ``from_generation`` and
    ``from_rank``; idempotent on (job_id, directive.generation, from_rank)."""

    kind: Literal["regroup_worker"] = "regroup_worker"
    command_id: str = Field(default_factory=lambda: new_id("cmd"))
    job_id: str
    from_generation: int
    from_rank: int
    directive: RegroupDirective


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


class FaultSpec(Message):
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


class FaultAccepted(BaseModel):
    """The answer to an accepted fault: where it went; the detector reports what it caused."""

    fault_id: str
    job_id: str
    generation: int
    rank: int
    node_id: str
    kind: FaultKind
    at_step: int | None


class InjectFault(JobRank, Message):
    """Deliver ``fault`` to one worker through its agent's local channel."""

    kind: Literal["inject_fault"] = "inject_fault"
    command_id: str = Field(default_factory=lambda: new_id("cmd"))
    fault: FaultSpec


AnyAgentCommand = StartWorker | StopWorkers | InjectFault | RegroupWorker
AgentCommand = Annotated[AnyAgentCommand, Field(discriminator="kind")]
AGENT_COMMAND = TypeAdapter(AgentCommand)


def ping_subject(node_id: str) -> str:
    """Core-NATS request/reply subject an agent answers while its process is alive."""
    return f"unicron.agents.{node_id}.ping"


def command_subject(node_id: str) -> str:
    return COMMAND_SUBJECT_PREFIX + node_id


class DeadLetter(Message):
    """A message no handler could take, kept on ``unicron.deadletter`` for an operator."""

    subject: str
    reason: str
    payload: str
    service: str
    deliveries: int = 1
    at: float = Field(default_factory=now)
