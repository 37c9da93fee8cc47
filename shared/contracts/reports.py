"""Reports: what workers tell their agent, and agents forward to the control plane.

A worker sends these over its agent's local channel; the agent forwards each
:data:`WorkerReport` as it is to ``unicron.reports.<node_id>.<kind>`` (stream
``UNICRON_REPORTS``), except ``WorkerPhase``, which is for the agent alone, as is the worker's
opening ``WorkerHello``, and ``StepCompleted``, which goes out with the node's other ranks'
steps in one :class:`StepsCompleted`. An agent also reports on its node itself
(:class:`GpuHealthReport`), on the same subjects; neither is a :data:`WorkerReport`, so no
worker can send one. The other direction, commands to agents and directives to workers, is
:mod:`unicron.shared.contracts.messages`.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, model_validator
from unicron.shared.contracts.identity import JobRank, WorkerIdentity
from unicron.shared.contracts.messages import Message
from unicron.shared.contracts.models import now
from unicron.shared.contracts.taxonomy import FailureCategory, Severity, severity_of
from unicron.shared.contracts.transitions import StateSource

REPORT_SUBJECT_PREFIX = "unicron.reports."


class _WorkerMessage(WorkerIdentity, Message):
    at: float = Field(default_factory=now)


class WorkerStarted(_WorkerMessage):
    """A worker's process is up: a warm spare that took the launch, or a fresh interpreter.
    ``spare_wait_s`` is how long the start waited for a spare still warming up; with ``warm``
    False after such a wait, that spare died or was late and a fresh process started instead."""

    kind: Literal["worker_started"] = "worker_started"
    pid: int
    warm: bool = False
    spare_wait_s: float = Field(0.0, ge=0)


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


class WorkerHello(JobRank, Message):
    """Local channel only: a worker's first line, so its agent can direct it before its first
    report. Not a report: never forwarded to the bus."""

    kind: Literal["hello"] = "hello"


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
    state_source: StateSource
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
    """An exception caught by the worker runtime, reported before the process dies; or, for a
    plain script, read by its agent from the tail of the worker's log after it exited."""

    kind: Literal["worker_exception"] = "worker_exception"
    pid: int
    exc_type: str
    message: str
    category: FailureCategory
    step: int | None = None
    launch_failed: bool = Field(
        False, description="the agent could not execute the job's command: no restart can help"
    )
    parked: bool = Field(
        False,
        description="the rank lives on, parked with its memory until a regroup (a peer's "
        "failure broke its collective); otherwise the process exits after this report",
    )

    @model_validator(mode="before")
    @classmethod
    def _unknown_category(cls, data: Any) -> Any:
        """A category this version does not know (a worker of another release) reads as
        software_other, the original named in the message: the failure is still recovered
        from, and counted against the job's own code, rather than dropped as a dead letter."""
        category = data.get("category") if isinstance(data, dict) else None
        if not isinstance(category, str) or category in FailureCategory._value2member_map_:
            return data
        message = data.get("message")
        note = f"(reported as category {category!r}, unknown here: read as software_other)"
        text = f"{message}\n{note}" if isinstance(message, str) else message
        return {**data, "category": FailureCategory.SOFTWARE_OTHER.value, "message": text}


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


class GpuSignal(str, Enum):
    """What a node's GPU health watch saw through NVML (``unicron.services.agent.gpuhealth``)."""

    XID = "xid"  # a critical-error (Xid) event
    ECC_DOUBLE_BIT = "ecc_double_bit"  # a double-bit ECC event, or the volatile count rose
    RETIREMENT_PENDING = "retirement_pending"  # retired pages wait for a reset
    REMAP_PENDING = "remap_pending"  # remapped rows wait for a reset, or remapping failed
    GPU_LOST = "gpu_lost"  # the GPU is gone: NVML_ERROR_GPU_IS_LOST, or "GPU unavailable"
    SLOWDOWN = "slowdown"  # hardware slowdown, thermal or power-brake throttling


EvidenceValue = int | float | str | bool | list[str] | None


class GpuHealthReport(Message):
    """A node-level report: a GPU of the node is faulty or slowed down. Not a worker's: the
    detector fails (or, for a slowdown, warns) the jobs whose ranks hold the GPU (``held_by``),
    or every job with a rank on the node where the agent cannot tell. Severity and action come
    from the taxonomy, by ``category``."""

    kind: Literal["gpu_health"] = "gpu_health"
    node_id: str
    boot_id: str = Field(description="the agent's boot that saw it")
    gpu: int | None = Field(
        description="NVML index of the GPU; None when NVML could not tell which GPU it was"
    )
    uuid: str | None = None
    held_by: list[JobRank] | None = Field(
        None,
        description="the ranks whose workers hold this GPU ([]: none does); None when the agent "
        "cannot tell which of its devices the GPU is, so every job on the node is affected",
    )
    signal: GpuSignal
    category: FailureCategory
    message: str = Field(description="what was seen, in one sentence")
    evidence: dict[str, EvidenceValue] = Field(
        default_factory=dict, description="the Xid, the counter and its last value, the reasons"
    )
    at: float = Field(default_factory=now)

    @property
    def severity(self) -> Severity:
        return severity_of(self.category)[0]


class StepsCompleted(Message):
    """A node's agent sends its ranks' steps of one job's generation together: one message per
    node per step, not one per rank (``unicron.services.agent.steps``). Each item is the rank's
    own ``StepCompleted`` as its worker sent it."""

    kind: Literal["steps_completed"] = "steps_completed"
    node_id: str
    job_id: str
    generation: int
    steps: list[StepCompleted] = Field(min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _one_node_job_and_generation(self) -> StepsCompleted:
        for step in self.steps:
            if (step.node_id, step.job_id, step.generation) != (
                self.node_id, self.job_id, self.generation,
            ):  # fmt: skip
                raise ValueError(
                    f"a step of {step.node_id}/{step.job_id} g{step.generation} in a batch of "
                    f"{self.node_id}/{self.job_id} g{self.generation}"
                )
        return self

    @classmethod
    def of(cls, steps: list[StepCompleted]) -> StepsCompleted:
        first = steps[0]
        return cls(node_id=first.node_id, job_id=first.job_id, generation=first.generation,
                   steps=steps)  # fmt: skip


AnyReport = AnyWorkerReport | GpuHealthReport | StepsCompleted
# Every report on the bus, for a consumer of the whole stream: workers' and agents' own.
REPORT = TypeAdapter(Annotated[AnyReport, Field(discriminator="kind")])


def report_id(report: AnyReport) -> str:
    """A stable id, so a report re-sent after a lost acknowledgement is dropped by NATS."""
    if isinstance(report, GpuHealthReport):
        where = f"{report.node_id}:{report.boot_id}:{report.gpu}"
        return f"{report.kind}:{where}:{report.signal.value}:{report.at:.6f}"
    if isinstance(report, StepsCompleted):
        first = report.steps[0]
        return f"{report.kind}:{report.job_id}:{report.generation}:{first.rank}:{first.step}"
    base = f"{report.kind}:{report.job_id}:{report.generation}:{report.rank}"
    if isinstance(report, StepCompleted | WorkerPhase):
        return f"{base}:{report.step}"
    if isinstance(report, WorkerRegrouped):
        return f"{base}:{report.resumed_step}"
    if isinstance(report, WorkerHung):
        return f"{base}:{report.last_step}:{report.at:.3f}"
    return f"{base}:{report.pid}"


def report_subject(report: AnyReport) -> str:
    return f"{REPORT_SUBJECT_PREFIX}{report.node_id}.{report.kind}"
