"""The job records, rebuilt from the event stream after Redis lost them.

Every job's submission, state changes, transitions and failures are events in the persistent
stream ``UNICRON_EVENTS``; replayed in stream order they give each job its spec, tenant, state,
generation, world size, restarts and history, and the plans give the counters that must never
go backwards (the plan sequence and the planner lease's fencing epoch). What no event says, the
workers each job's current generation runs now, comes from the agents' inventories
(:mod:`unicron.services.executor.rebuild`). Pure: events in, records out (docs/design.md §6).

Replay is fenced like the live handlers: a finished job stays finished whatever comes later,
an event of an older generation than the job's changes nothing, and a state change must be a
move of the lifecycle's table (:mod:`unicron.shared.contracts.lifecycle`, which says why it may skip
a state).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from unicron.shared.contracts.blame import job_failures
from unicron.shared.contracts.events import (
    CloudEvent,
    EventData,
    FailureDetected,
    JobStateChanged,
    JobSubmitted,
    NodeJoined,
    NodeLost,
    NodeStateChanged,
    PlanCreated,
    TransitionCompleted,
    TransitionStarted,
)
from unicron.shared.contracts.models import HistoryEntry, Job, JobState, NodeState, PlanAction
from unicron.shared.contracts.taxonomy import RecoveryAction
from unicron.shared.contracts.transitions import TransitionMode


@dataclass
class ReplayedCluster:
    """What the stream says about the cluster: its jobs and its counters."""

    jobs: dict[str, Job] = field(default_factory=dict)
    plan_seq: int = 0
    planner_epoch: int = 0
    # node id → whether it was in the cluster at its last event (joined and not lost since)
    nodes: dict[str, bool] = field(default_factory=dict)
    # node id → when its quarantine ends, for nodes whose last change quarantined them
    quarantined: dict[str, float] = field(default_factory=dict)
    # jobs some event names but whose submission is not in the stream: nothing to rebuild from
    unknown_jobs: set[str] = field(default_factory=set)
    events: int = 0

    @property
    def expected_nodes(self) -> set[str]:
        return {node_id for node_id, present in self.nodes.items() if present}


def event_time(event: CloudEvent) -> float:
    return datetime.fromisoformat(event.time).timestamp()


class Replayer:
    """Feed it the stream's events in order (:meth:`apply`), then read :attr:`cluster`."""

    def __init__(self) -> None:
        self.cluster = ReplayedCluster()
        # per job, the plans that restarted it: a fallback re-sends its plan's transition
        self._restarts: dict[str, set[str]] = {}

    def apply(self, event: CloudEvent) -> None:
        self.cluster.events += 1
        data = event.typed()
        at = event_time(event)
        if isinstance(data, JobSubmitted):
            self._submitted(data, at)
        elif isinstance(data, PlanCreated):
            self.cluster.plan_seq = max(self.cluster.plan_seq, data.seq)
            self.cluster.planner_epoch = max(self.cluster.planner_epoch, data.epoch)
        elif isinstance(data, NodeJoined | NodeLost | NodeStateChanged):
            self._node(data)
        else:
            self._job_event(data, at)

    def _job_event(self, data: EventData, at: float) -> None:
        job_id = getattr(data, "job_id", None)
        if job_id is None:
            return
        job = self.cluster.jobs.get(job_id)
        if job is None:
            self.cluster.unknown_jobs.add(job_id)
            return
        if job.state.terminal:
            return  # fenced: nothing resurrects a finished job
        if isinstance(data, JobStateChanged):
            _state_changed(job, data, at)
        elif isinstance(data, TransitionStarted):
            self._transition_started(job, data, at)
        elif isinstance(data, TransitionCompleted):
            _transition_completed(job, data)
        elif isinstance(data, FailureDetected):
            _failure(job, data)

    def _submitted(self, data: JobSubmitted, at: float) -> None:
        if data.job_id in self.cluster.jobs:
            return  # a retried submission announces the same job again
        self.cluster.unknown_jobs.discard(data.job_id)
        self.cluster.jobs[data.job_id] = Job(
            id=data.job_id,
            name=data.name,
            spec=data.spec,
            tenant=data.tenant,
            submitted_at=at,
            history=[HistoryEntry(at=at, state=JobState.PENDING, reason="submitted")],
        )

    def _node(self, data: NodeJoined | NodeLost | NodeStateChanged) -> None:
        if isinstance(data, NodeStateChanged):
            present = data.new != NodeState.LOST
            self.cluster.quarantined.pop(data.node_id, None)
            if data.new == NodeState.QUARANTINED and data.until is not None:
                self.cluster.quarantined[data.node_id] = data.until
        else:
            present = isinstance(data, NodeJoined)
        self.cluster.nodes[data.node_id] = present

    def _transition_started(self, job: Job, data: TransitionStarted, at: float) -> None:
        if data.generation <= job.generation and job.plan_id is not None:
            return  # stale, or already applied
        # transitions.fall_back starts a generation under the plan that started the last one
        fallback = job.plan_id == data.plan_id
        job.generation = data.generation
        job.plan_id = data.plan_id
        job.transition = data.action
        job.world_size = data.to_workers
        job.transition_started_at = at
        job.stepping = False
        job.transition_kind = TransitionMode.CHECKPOINT if fallback else data.kind
        job.transition_fallback = "in-place transition failed" if fallback else None
        restarts = self._restarts.setdefault(job.id, set())
        if data.action == PlanAction.RESTART and data.plan_id not in restarts:
            restarts.add(data.plan_id)
            job.recoveries += 1


def _state_changed(job: Job, data: JobStateChanged, at: float) -> None:
    if data.generation < job.generation and not data.new.terminal:
        return  # an older generation's news
    # restored even when a lost announcement left the job elsewhere (shared/contracts/lifecycle.py)
    job.replay_state(data.old, data.new, data.reason, at)
    if job.state != data.new:
        return  # refused (logged): the lifecycle has no such move
    job.generation = max(job.generation, data.generation)
    job.step = data.step
    if data.new == JobState.PENDING:  # preempted: its workers were stopped
        job.world_size = 0
        job.transition = None
        job.transition_kind = None
    if data.new.terminal:
        job.stepping = True  # a late step report must not read as a new generation's first


def _transition_completed(job: Job, data: TransitionCompleted) -> None:
    if data.generation != job.generation:
        return
    job.stepping = True
    job.world_size = data.world_size
    job.transition_kind = data.kind or job.transition_kind
    job.transition_fallback = data.fallback


def _failure(job: Job, data: FailureDetected) -> None:
    if data.action == RecoveryAction.REPORT or data.generation != job.generation:
        return  # advisory, or not about the generation that runs
    if job.last_failure is not None and job.last_failure.generation == data.generation:
        return  # the detector records one failure per generation: the first
    job.code_failures += job_failures(data, job.last_failure)
    job.last_failure = data.record(job.step)


def replay(events: Iterable[CloudEvent]) -> ReplayedCluster:
    replayer = Replayer()
    for event in events:
        replayer.apply(event)
    return replayer.cluster
