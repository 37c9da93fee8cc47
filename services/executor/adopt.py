"""A rebuilt job's workers, from what its agents run and what its workers reported.

After Redis lost its records, the event stream gives each job its generation and world size
(:mod:`unicron.shared.store.replay`) but not where each rank runs. The agents' heartbeats list the
workers they run (``NodeRecord.workers``) and the reports stream keeps each worker's start and exit;
the latest fact about a seat (a (job, generation, rank)) wins. A rank that runs is re-adopted
and the job continues; a job whose every rank exited 0 has succeeded; a rank gone without a
trace is a failure of the running generation, recovered from as the detector's would be. A
worker no rebuilt job's current generation claims is an orphan to stop. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from unicron.shared.contracts.events import FailureDetected
from unicron.shared.contracts.models import (
    Job,
    JobState,
    NodeRecord,
    NodeWorker,
    WorkerRecord,
    WorkerState,
)
from unicron.shared.contracts.reports import (
    AnyWorkerReport,
    WorkerExited,
    WorkerRegrouped,
    WorkerStarted,
)
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind

Seat = tuple[str, int, int]  # (job id, generation, rank)
_ACTIVE = (JobState.STARTING, JobState.RUNNING, JobState.RECOVERING)


@dataclass
class SeatTrace:
    """What the reports stream says about one seat: the latest start and the exit."""

    node_id: str
    pid: int
    started_at: float
    exit: WorkerExited | None = None


@dataclass(frozen=True)
class OrphanStop:
    """Stop the job's workers on the node below ``below`` (all of them when None)."""

    node_id: str
    job_id: str
    below: int | None


def note_report(traces: dict[Seat, SeatTrace], report: AnyWorkerReport) -> None:
    """Fold one start, regroup or exit report into the traces."""
    seat = (report.job_id, report.generation, report.rank)
    if isinstance(report, WorkerStarted | WorkerRegrouped):
        trace = traces.get(seat)
        if trace is None or report.at >= trace.started_at:
            exited = trace.exit if trace is not None else None
            traces[seat] = SeatTrace(report.node_id, report.pid, report.at, exited)
    elif isinstance(report, WorkerExited):
        trace = traces.setdefault(seat, SeatTrace(report.node_id, report.pid, 0.0))
        trace.exit = report


def _exited(rank: int, report: WorkerExited) -> WorkerRecord:
    if report.stopped_by_agent:
        state = WorkerState.STOPPED
    else:
        state = WorkerState.SUCCEEDED if report.exit_code == 0 else WorkerState.FAILED
    code = report.exit_code if report.signal is None else -report.signal
    return WorkerRecord(
        rank=rank, node_id=report.node_id, pid=report.pid, state=state, exit_code=code
    )


def _seat(
    job: Job,
    rank: int,
    running: Mapping[int, tuple[NodeRecord, NodeWorker]],
    traces: Mapping[Seat, SeatTrace],
    heartbeats: Mapping[str, float],
) -> WorkerRecord:
    """One rank of the job's current generation, from the latest fact about it."""
    trace = traces.get((job.id, job.generation, rank))
    seen = running.get(rank)
    exit_report = trace.exit if trace is not None else None
    if exit_report is not None and (seen is None or exit_report.at >= seen[0].last_heartbeat):
        return _exited(rank, exit_report)
    if seen is not None:
        node, worker = seen
        return WorkerRecord(rank=rank, node_id=node.id, pid=worker.pid, state=WorkerState.RUNNING)
    if trace is not None and trace.started_at >= heartbeats.get(trace.node_id, float("inf")):
        # started after its node's last heartbeat: too new for the inventory, but running
        return WorkerRecord(
            rank=rank, node_id=trace.node_id, pid=trace.pid, state=WorkerState.RUNNING
        )
    node_id = trace.node_id if trace is not None else ""
    return WorkerRecord(rank=rank, node_id=node_id, state=WorkerState.FAILED)


def _lost(job: Job, lost: list[WorkerRecord], at: float) -> None:
    """Record the lost ranks as a failure of the running generation: the planner restarts
    the job as it would after the detector's (its survivors re-form in place)."""
    first = lost[0]
    ranks = ", ".join(str(w.rank) for w in lost)
    why = f"rank(s) {ranks} found neither running nor finished when the records were rebuilt"
    job.last_failure = FailureDetected.of(
        FailureCategory.EXITED_ABNORMALLY,
        failure_id=f"{job.id}:{job.generation}",
        job_id=job.id,
        node_id=first.node_id or None,
        rank=first.rank,
        generation=job.generation,
        kind=FailureKind.EXIT,
        observed_at=at,
        message=why,
    ).record(job.step)
    reason = f"rebuild: rank(s) {ranks} of generation {job.generation} lost"
    job.set_state(JobState.RECOVERING, reason, by=ServiceRole.EXECUTOR)


def adopt(
    job: Job, nodes: Iterable[NodeRecord], traces: Mapping[Seat, SeatTrace], at: float
) -> Job:
    """Give ``job`` (rebuilt from the stream) the workers of its current generation."""
    nodes = list(nodes)
    if job.state not in _ACTIVE:
        job.workers = []
        return job
    mine = [(n, w) for n in nodes for w in n.workers if w.job_id == job.id]
    newest = max((w.generation for _, w in mine), default=job.generation)
    if newest > job.generation:
        # the stream missed the transition (it is announced after its commands went out)
        job.generation, job.world_size, job.stepping = newest, 0, False
    running = {w.rank: (n, w) for n, w in mine if w.generation == job.generation}
    world = job.world_size or (max(running) + 1 if running else 0)
    job.world_size = world
    heartbeats = {n.id: n.last_heartbeat for n in nodes}
    job.workers = [_seat(job, r, running, traces, heartbeats) for r in range(world)]
    if world and all(w.state == WorkerState.SUCCEEDED for w in job.workers):
        job.set_state(JobState.SUCCEEDED, f"all {world} workers finished", by=ServiceRole.EXECUTOR)
        return job
    lost = [w for w in job.workers if w.state in (WorkerState.FAILED, WorkerState.STOPPED)]
    if lost and not job.needs_recovery():
        _lost(job, lost, at)
    return job


def _regrouping(job: Job, worker: NodeWorker) -> bool:
    """A survivor told to re-form into the current generation that has not done so yet."""
    return any(
        w.from_generation == worker.generation and w.from_rank == worker.rank for w in job.workers
    )


def orphan_stops(nodes: Iterable[NodeRecord], jobs: Mapping[str, Job]) -> list[OrphanStop]:
    """The workers no job's current generation claims: of a job with no record or a finished
    one (stop them all), or of an older generation (stop those below the current one)."""
    stops: set[OrphanStop] = set()
    for node in nodes:
        for worker in node.workers:
            job = jobs.get(worker.job_id)
            if job is None or job.state.terminal:
                stops.add(OrphanStop(node.id, worker.job_id, None))
            elif worker.generation < job.generation and not _regrouping(job, worker):
                stops.add(OrphanStop(node.id, job.id, job.generation))
    return sorted(stops, key=lambda s: (s.node_id, s.job_id))
