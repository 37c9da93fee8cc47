"""Executor service wiring: plans and worker reports in, transitions and progress out.

One active instance under the ``executor`` lease, any number of warm standbys
(:mod:`unicron.shared.terms`): a standby holds its connections and imports and takes the role
within the lease's TTL of the active one's death, instead of a restarted process's seconds of
start-up. Every handler first checks that the lease is still this instance's; one that lost it
leaves the message unacked for its successor.

Level-triggered: every ``reconcile_interval_s`` the latest plan is applied again (a no-op when
it already was) and agents are asked again for workers that never started, so an executor
restarted at any line converges.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from unicron.services.executor.commands import send_starts
from unicron.services.executor.fastpath import FastPath
from unicron.services.executor.progress import ProgressTracker
from unicron.services.executor.rebuild import Rebuilder
from unicron.services.executor.settings import ExecutorSettings
from unicron.services.executor.survivors import rank_nodes
from unicron.services.executor.transitions import TransitionRunner
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.bus.streams import ALL_REPORTS
from unicron.shared.claims import ReportClaims
from unicron.shared.contracts.events import CloudEvent, FailureDetected, PlanCreated, event_subject
from unicron.shared.contracts.models import JobState, now
from unicron.shared.contracts.reports import REPORT
from unicron.shared.contracts.transitions import TransitionMode
from unicron.shared.logging import get_logger
from unicron.shared.outage import Outage
from unicron.shared.store.lease import EXECUTOR_LEASE, Lease
from unicron.shared.store.state import StateStore
from unicron.shared.store.summaries import job_summaries
from unicron.shared.terms import check_holder, hold_term, serve_terms

log = get_logger()
T = TypeVar("T")


class Executor:
    def __init__(
        self, bus: Bus, state: StateStore, settings: ExecutorSettings, lease: Lease | None = None
    ) -> None:
        self.bus = bus
        self.state = state
        self.settings = settings
        ttl, instance = settings.executor_lease_ttl_s, settings.executor_instance
        self.lease = lease or state.lease(EXECUTOR_LEASE, ttl, instance=instance)
        self.transitions = TransitionRunner(bus, state, settings)
        self.progress = ProgressTracker(bus, state, on_failed=self.transitions.fall_back)
        self.fast_path = FastPath(state, self.transitions)
        self._asked: dict[tuple[str, int], int] = {}  # (job, generation) -> asks again so far

    async def on_event(self, event: CloudEvent) -> None:
        check_holder(self.lease)
        data = event.typed()
        if isinstance(data, FailureDetected):
            if data.job_id is not None:
                await self.progress.on_failure_detected(
                    data.failure_id, data.job_id, data.detected_at
                )
                if self.settings.fast_path:
                    await self.fast_path.on_failure(data)
            return
        if not isinstance(data, PlanCreated):
            return
        plan = await self.state.get_plan(data.plan_id)
        if plan is None:
            log.warning("plan announced but not stored", plan_id=data.plan_id)
            return
        await self.transitions.apply_plan(plan)

    async def reconcile(self) -> None:
        """Apply the latest plan; fall back from a regroup that never stepped; ask again for
        workers that never started. Reads the summaries, and the records of stuck jobs only."""
        check_holder(self.lease)
        plan = await self.state.latest_plan()
        if plan is not None:
            await self.transitions.apply_plan(plan)
        launching: set[tuple[str, int]] = set()
        for job in await job_summaries(self.state):
            if job.state.terminal:  # cancelled by the api, say: its gauges go
                self.progress.metrics.forget(job.id)
            if job.state not in (JobState.STARTING, JobState.RECOVERING):
                continue
            waited = now() - (job.transition_started_at or now())
            regrouping = job.transition_kind == TransitionMode.IN_PLACE and not job.stepping
            late = regrouping and waited > self.settings.regroup_timeout_s
            if late and job.state == JobState.RECOVERING:
                why = f"no step {waited:.0f} s after the regroup started"
                await self.transitions.fall_back(job.id, job.generation, why)
                continue
            if job.launching_ranks:
                launching.add((job.id, job.generation))
                await self._start_again(job.id, job.generation, waited, job.launching_ranks)
        self._asked = {key: n for key, n in self._asked.items() if key in launching}

    async def _start_again(
        self, job_id: str, generation: int, waited: float, not_started: int
    ) -> None:
        """Ask once more each ``launch_timeout_s`` for the workers that have not started, not
        at every tick: a start that is slow under load (4,096 ranks) was sent again in full
        every 2 s, which only added to the load."""
        key = (job_id, generation)
        due = int(waited // self.settings.launch_timeout_s)
        if due <= self._asked.get(key, 0):
            return
        self._asked[key] = due
        job = await self.state.get_job(job_id)
        if job is None or job.generation != generation:
            return
        log.warning(
            "workers not started; asking agents again",
            job_id=job.id,
            ask=due,
            launching=not_started,  # as the summary counted them
        )
        nodes = await self.state.get_nodes(rank_nodes(job))  # the job's, not the cluster's
        await send_starts(self.bus, job, {n.id: n for n in nodes}, ask=due)

    async def loop(self, stop: asyncio.Event) -> None:
        outage = Outage("executor reconcile", component="executor")
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                wait = max(self.settings.reconcile_interval_s, outage.delay())
                await asyncio.wait_for(stop.wait(), wait)
            try:
                await self.reconcile()
                outage.ok()
            except Exception as exc:
                outage.failed(exc)

    async def term(self, stop: asyncio.Event) -> None:
        """Serve while the lease is held: subscribe on a connection of the term's own, apply
        plans and reports, reconcile; return when the lease is lost or ``stop`` is set."""
        log.info("executor active", epoch=self.lease.epoch, holder=self.lease.holder)
        # Rebuilds the records if Redis lost them; reports wait until it is sure they are there.
        records = Rebuilder(self.bus, self.state, self.settings)

        async def check_records() -> None:
            with contextlib.suppress(Exception):  # its watch tries again, and logs why
                await records.check()

        async def connect() -> Bus:
            access = self.settings.nats_access
            return await Bus.connect(
                self.settings.nats_url, "unicron/executor", access=access, metrics=self.bus.metrics
            )

        loops = [lambda: self.loop(stop), lambda: records.watch(stop)]
        subscribe = functools.partial(self._subscribe, records=records)
        await hold_term(self.lease, stop, loops, connect, subscribe, prepare=check_records)
        if not stop.is_set():
            log.warning("executor standing by: lease lost", epoch=self.lease.epoch)

    async def _subscribe(self, bus: Bus, records: Rebuilder) -> None:
        plans, failures = event_subject(PlanCreated.TYPE), event_subject(FailureDetected.TYPE)
        await bus.consume(plans, "executor", parse_event, self.on_event)
        await bus.consume(failures, "executor-failures", parse_event, self.on_event)
        await bus.consume(
            ALL_REPORTS,
            "executor-reports",
            REPORT.validate_json,  # an agent's report on its node too: passed over, not refused
            self._held(records.gated(self.progress.on_report)),
            claim=records.gated(ReportClaims(self.state).check),
            batch=self._held(records.gated(self.progress.on_reports)),  # a few writes per job
        )

    def _held(self, handler: Callable[[T], Awaitable[None]]) -> Callable[[T], Awaitable[None]]:
        async def checked(item: T) -> None:
            check_holder(self.lease)
            await handler(item)

        return checked


async def run(bus: Bus, state: StateStore, stop: asyncio.Event, settings: ExecutorSettings) -> None:
    executor = Executor(bus, state, settings)
    await serve_terms(executor.lease, lambda: executor.term(stop), stop)
