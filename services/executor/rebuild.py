"""The control plane rebuilds its records after Redis lost them (docs/design.md §6).

Redis holds a marker, ``unicron:cluster``, written once it holds the cluster's records. The
executor checks it a few times a second: missing (a Redis that restarted empty, or a cluster's
first start) means a rebuild. It waits for every node to heartbeat once more (each agent
re-registers its node with the workers it runs), replays the event stream into job records
(:mod:`unicron.shared.store.replay`), gives each job the workers its current generation runs
(:mod:`unicron.services.executor.adopt`), stores the jobs that have no record, stops the workers no
job claims, raises the plan sequence and the planner's fencing epoch above anything the stream
holds, and only then writes the marker. Every write is create-if-absent or raise-to-at-least,
so a second rebuild, or one that races the API's new submissions, changes nothing.

While a rebuild may be due, the executor's worker reports wait (:meth:`Rebuilder.gated`): a
report handled against a missing record would be lost, and a finished worker's exit with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ParamSpec

from unicron.services.executor.adopt import (
    OrphanStop,
    Seat,
    SeatTrace,
    adopt,
    note_report,
    orphan_stops,
)
from unicron.services.executor.settings import ExecutorSettings
from unicron.shared.bus.api import EventBus
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.bus.delivery import PARSE_ERRORS
from unicron.shared.bus.streams import (
    ALL_EVENTS,
    EVENTS_STREAM,
    REPORTS_STREAM,
    reports_of_kind,
)
from unicron.shared.contracts.events import JobStateChanged, PlanCreated, event_subject
from unicron.shared.contracts.messages import StopWorkers
from unicron.shared.contracts.models import Job, NodeRecord, NodeState, new_id, now
from unicron.shared.contracts.reports import WORKER_REPORT, report_subject
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.logging import get_logger
from unicron.shared.outage import Outage, is_outage
from unicron.shared.store.lease import PLANNER_LEASE, lease_keys
from unicron.shared.store.replay import ReplayedCluster, Replayer
from unicron.shared.store.state import StateStore

P = ParamSpec("P")
log = get_logger(component="rebuild")
TRACE_SUBJECTS = [
    reports_of_kind(kind) for kind in ("worker_started", "worker_regrouped", "worker_exited")
]
CHECK_INTERVAL_S = 0.25


class StateRebuildingError(ConnectionError):
    """Redis may have lost the records a report updates: an outage, so the bus holds the
    report until the records are back."""


@dataclass(frozen=True)
class RebuildSummary:
    events: int
    restored: list[str]
    orphans_stopped: int
    took_s: float


async def replay_events(bus: EventBus) -> ReplayedCluster:
    replayer = Replayer()
    async for _subject, raw in bus.read_stream(EVENTS_STREAM, [ALL_EVENTS]):
        try:
            replayer.apply(parse_event(raw))
        except PARSE_ERRORS:
            continue  # dead-lettered when it was published; nothing to rebuild from
    return replayer.cluster


async def read_traces(bus: EventBus) -> dict[Seat, SeatTrace]:
    traces: dict[Seat, SeatTrace] = {}
    async for subject, raw in bus.read_stream(REPORTS_STREAM, TRACE_SUBJECTS):
        try:
            report = WORKER_REPORT.validate_json(raw)
        except PARSE_ERRORS:
            continue
        if subject == report_subject(report):  # sent as the node it is about
            note_report(traces, report)
    return traces


class Rebuilder:
    def __init__(self, bus: Bus, state: StateStore, settings: ExecutorSettings) -> None:
        self.bus = bus
        self.state = state
        self.settings = settings
        self.pending = True  # until Redis is seen to hold the cluster's records
        self.last: RebuildSummary | None = None

    # --- the gate on report handling -----------------------------------------------------

    def gated(self, handler: Callable[P, Awaitable[None]]) -> Callable[P, Awaitable[None]]:
        """``handler``, held back while a rebuild may be due; a Redis outage makes it due."""

        async def run(*args: P.args, **kwargs: P.kwargs) -> None:
            if self.pending:
                raise StateRebuildingError("records not yet confirmed after a Redis outage")
            try:
                await handler(*args, **kwargs)
            except Exception as exc:
                if is_outage(exc):
                    self.pending = True
                raise

        return run

    async def watch(self, stop: asyncio.Event) -> None:
        """Check the marker until ``stop``; rebuild when it is missing."""
        outage = Outage("records check", cap_s=1.0, component="executor")
        while not stop.is_set():
            try:
                await self.check()
                outage.ok()
            except Exception as exc:
                if is_outage(exc):
                    self.pending = True
                outage.failed(exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(CHECK_INTERVAL_S, outage.delay()))

    async def check(self) -> None:
        if await self.state.cluster_marker() is None:
            self.pending = True
            self.last = await self.rebuild()
        elif self.pending:
            await self._raise_counters_to_last_plan()  # Redis kept its data: ≤ 1 s may be lost
        self.pending = False

    # --- the rebuild ---------------------------------------------------------------------

    async def rebuild(self) -> RebuildSummary:
        started, since = time.monotonic(), now()
        replayed = await replay_events(self.bus)
        if replayed.jobs or replayed.quarantined:  # a fresh inventory, every report up to it
            nodes = await self._fresh_nodes(replayed.expected_nodes, since)
            traces = await read_traces(self.bus)
            await self._quarantine(replayed.quarantined)
        else:
            nodes, traces = await self.state.list_nodes(), {}
        restored = await self._restore(replayed, nodes, traces)
        records = {job.id: job for job in await self.state.list_jobs()}
        stops = orphan_stops(nodes, records)
        incarnation = new_id("cluster")
        for stop in stops:
            await self._stop(stop, incarnation)
        epoch = replayed.planner_epoch + 1 if replayed.planner_epoch else 0
        await self._raise_counters(replayed.plan_seq, epoch)
        await self.state.mark_cluster(incarnation)
        summary = RebuildSummary(
            replayed.events, [j.id for j in restored], len(stops), time.monotonic() - started
        )
        if replayed.events:
            log.warning(
                "records rebuilt from the bus and the agents",
                events=summary.events,
                jobs=len(replayed.jobs),
                restored=len(restored),
                orphans_stopped=len(stops),
                unknown_jobs=len(replayed.unknown_jobs),
                took_s=round(summary.took_s, 3),
            )
        return summary

    async def _fresh_nodes(self, expected: set[str], since: float) -> list[NodeRecord]:
        """The nodes once each expected one heartbeat after ``since`` (or its timeout ran out)."""
        deadline = time.monotonic() + self.settings.node_timeout_s
        while True:
            nodes = await self.state.list_nodes()
            present = expected | {n.id for n in nodes if n.state == NodeState.READY}
            fresh = {n.id for n in nodes if n.last_heartbeat >= since}
            if present <= fresh or time.monotonic() >= deadline:
                return nodes
            await asyncio.sleep(self.settings.heartbeat_interval_s / 10)

    async def _quarantine(self, until_by_node: dict[str, float]) -> None:
        """A node re-registers READY; one still in quarantine goes back into it."""
        for node_id, until in until_by_node.items():

            def again(node: NodeRecord, until: float = until) -> bool:
                if until <= now() or node.state != NodeState.READY:
                    return False
                node.set_state(NodeState.QUARANTINED, "restored", by=ServiceRole.EXECUTOR)
                node.quarantined_until = until
                return True

            node = await self.state.update_node(node_id, again)
            if node is not None and node.state == NodeState.QUARANTINED:
                get_logger(node_id=node_id).warning("quarantine restored", until=until)

    async def _restore(
        self, replayed: ReplayedCluster, nodes: list[NodeRecord], traces: dict[Seat, SeatTrace]
    ) -> list[Job]:
        restored = []
        for job in replayed.jobs.values():
            before = job.state
            adopt(job, nodes, traces, now())
            if not await self.state.restore_job(job):
                continue  # it has a record (the data survived, or another rebuild was first)
            restored.append(job)
            get_logger(job_id=job.id).info(
                "job record rebuilt",
                state=job.state.value,
                generation=job.generation,
                workers=len(job.workers),
            )
            # adopt moves a job only through set_state, so its reason is the history's last
            event = JobStateChanged.between(before, job)
            if event is not None:
                await self.bus.publish_event(event)
        return restored

    async def _stop(self, stop: OrphanStop, incarnation: str) -> None:
        get_logger(job_id=stop.job_id, node_id=stop.node_id).warning(
            "stopping orphaned workers", below_generation=stop.below
        )
        command = StopWorkers(
            # an id of its own: the usual stop id may have been sent (and dropped) before
            command_id=f"rebuild:{incarnation}:stop:{stop.job_id}:{stop.below}:{stop.node_id}",
            job_id=stop.job_id,
            below_generation=stop.below,
            reason="no rebuilt job's current generation runs it",
        )
        await self.bus.send_command(stop.node_id, command)

    async def _raise_counters(self, plan_seq: int, planner_epoch: int) -> None:
        """Nothing goes backwards: the next plan is numbered above every plan in the stream,
        and a planner lease taken from now on is fenced above every plan's epoch."""
        await self.state.raise_plan_seq(plan_seq)
        epoch_key = lease_keys(PLANNER_LEASE, self.state.prefix)[1]
        await self.state.raise_counter(epoch_key, planner_epoch)

    async def _raise_counters_to_last_plan(self) -> None:
        raw = await self.bus.last_message(EVENTS_STREAM, event_subject(PlanCreated.TYPE))
        if raw is None:
            return
        data = parse_event(raw).typed()
        if isinstance(data, PlanCreated):
            await self._raise_counters(data.seq, data.epoch)
