"""The agent ↔ worker contract, typed like the bus: the directives and the worker's environment.

A worker process and its node agent speak over two things, and both are models here:

- **The environment** a worker starts with is one model, :class:`WorkerEnv`: the agent writes
  it with :meth:`WorkerEnv.to_environ`, the worker (and a script on :mod:`unicron.train`) reads
  it with :meth:`WorkerEnv.read`, so each variable's name is written once, here.
- **The local channel** (a unix socket of JSON lines, ``unicron.trainer.channel`` ↔
  ``unicron.services.agent.channel``): upward, each line is a
  ``unicron.shared.contracts.reports.WorkerReport``; downward, each line is a
  :data:`WorkerDirective`, a union discriminated on ``directive``: ``launch`` (a warm spare becomes
  a worker), ``regroup`` (re-form in place under a new generation) and ``fault`` (a drill).
  :func:`parse_directive` is the one decoder; a line it rejects is logged and dropped by the worker,
  never half-applied.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)
from unicron.shared.contracts.messages import FaultSpec, GroupSeat, Message, RegroupDirective
from unicron.shared.contracts.models import JobSpec

# Long enough for the control plane to detect, plan and send a regroup; a worker nobody
# regroups then exits 1 as it would have without parking.
DEFAULT_PARK_TIMEOUT_S = 60.0


class WorkerLaunch(GroupSeat):
    """Everything a worker process needs, passed by its agent in ``UNICRON_WORKER_LAUNCH``."""

    node_id: str
    spec: JobSpec
    checkpoint_dir: str
    agent_socket: str = Field(description="unix socket of the agent's local channel")


class ScriptLaunch(Message):
    """The worker process a warm spare becomes, run in the spare's own process: ``argv`` is
    ``[python, SCRIPT, ARGS…]`` or ``[python, -m, MODULE, ARGS…]`` (a job's entrypoint, or the
    module of its registered trainer), run with exactly ``env`` in ``cwd`` — what a fresh
    process of that worker would have been given."""

    argv: list[str] = Field(min_length=2)
    env: dict[str, str]
    cwd: str | None = None


class SpareLaunch(Message):
    """Agent → warm spare: become this worker (``unicron.trainer.spare``) by running ``script``,
    the job's own trainer or entrypoint: a spare runs no trainer of its own."""

    directive: Literal["launch"] = "launch"
    launch: WorkerLaunch
    script: ScriptLaunch


class FaultDirective(Message):
    """Agent → worker: inject ``fault`` (a drill) at its step."""

    directive: Literal["fault"] = "fault"
    fault: FaultSpec


AnyWorkerDirective = SpareLaunch | RegroupDirective | FaultDirective
WorkerDirective = Annotated[AnyWorkerDirective, Field(discriminator="directive")]
WORKER_DIRECTIVE: TypeAdapter[AnyWorkerDirective] = TypeAdapter(WorkerDirective)


class DirectiveError(ValueError):
    """A channel line that is not a valid directive; ``name`` is the directive it claimed to
    be, if it named one (a spare drops junk but must not ignore a broken launch)."""

    def __init__(self, reason: str, name: str | None = None) -> None:
        super().__init__(reason)
        self.name = name


def parse_directive(line: bytes | str) -> AnyWorkerDirective:
    """Decode one line from the agent; raises :class:`DirectiveError` saying what is wrong."""
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's stack
        raise DirectiveError("not JSON") from None
    if not isinstance(raw, dict):
        raise DirectiveError("not a JSON object")
    name = raw.get("directive")
    try:
        return WORKER_DIRECTIVE.validate_python(raw)
    except ValidationError as exc:
        label = name if isinstance(name, str) else None
        raise DirectiveError(f"not a valid directive: {exc}", label) from None


def directive_line(directive: AnyWorkerDirective) -> bytes:
    return directive.model_dump_json().encode() + b"\n"


class WorkerEnv(BaseModel):
    """The ``UNICRON_*`` variables a worker process reads; unset ones are None or default.

    An agent sets ``launch``, ``agent_socket``, ``job_id`` and ``checkpoint_dir`` for a worker
    (``agent_socket`` and ``spare`` for a warm spare); an operator may set ``park_timeout_s`` on the
    agent, and a local run (no agent) reads ``job_spec`` and ``checkpoint_dir``. A worker that
    inherits ``checkpoint_url`` (from its agent or the job's env) also keeps its checkpoints in
    that object store (``unicron.trainer.objectstore``).
    """

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    launch: WorkerLaunch | None = Field(None, alias="UNICRON_WORKER_LAUNCH")
    agent_socket: str | None = Field(None, alias="UNICRON_AGENT_SOCKET")
    spare: bool = Field(False, alias="UNICRON_WORKER_SPARE")
    job_id: str | None = Field(None, alias="UNICRON_JOB_ID")
    checkpoint_dir: str | None = Field(None, alias="UNICRON_CHECKPOINT_DIR")
    # An fsspec URL (s3://bucket/prefix): each job's checkpoints go to <url>/<job_id>/.
    checkpoint_url: str | None = Field(None, alias="UNICRON_CHECKPOINT_URL")
    job_spec: str | None = Field(None, alias="UNICRON_JOB_SPEC", description="local runs")
    # How long a worker whose peer died keeps its memory waiting for a regroup directive.
    park_timeout_s: float = Field(DEFAULT_PARK_TIMEOUT_S, alias="UNICRON_PARK_TIMEOUT_S")

    @field_validator("launch", mode="before")
    @classmethod
    def _launch_from_json(cls, value: Any) -> Any:
        if not isinstance(value, str | bytes):
            return value
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            raise ValueError("not JSON") from None

    @field_validator("park_timeout_s", mode="wrap")
    @classmethod
    def _default_when_unreadable(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # An operator's typo must not stop every worker from starting: the default holds.
        try:
            return max(0.0, handler(value))
        except ValidationError:
            return DEFAULT_PARK_TIMEOUT_S

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """The worker's environment (``os.environ`` by default); raises ValueError naming the
        variable that is not valid."""
        source = os.environ if environ is None else environ
        names = {field.alias for field in cls.model_fields.values()}
        try:
            return cls.model_validate({k: v for k, v in source.items() if k in names})
        except ValidationError as exc:
            error = exc.errors()[0]
            name = error["loc"][0] if error["loc"] else "environment"
            what = "WorkerLaunch" if name == "UNICRON_WORKER_LAUNCH" else "value"
            raise ValueError(f"{name} is not a valid {what}: {exc}") from None

    def to_environ(self) -> dict[str, str]:
        """The variables for the fields that were set, as a process environment holds them."""
        # include, not exclude_unset: that would also drop the defaults inside the launch
        data = self.model_dump(mode="json", by_alias=True, include=self.model_fields_set)
        return {name: _env_text(value) for name, value in data.items() if value is not None}


def _env_text(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def env_name(field: str) -> str:
    """The variable that holds ``field`` of :class:`WorkerEnv`, for messages and for tests."""
    alias = WorkerEnv.model_fields[field].alias
    assert alias is not None
    return alias
