"""The planner service: triggers in, plans out.

Level-triggered: every planning pass rebuilds its inputs from Redis, so events only say
*when* to look, never *what* is true. Event handlers mark the planner dirty and return at
once; one planning task waits ``planner_debounce_s`` after the first trigger and plans once
for the whole burst. A reconcile tick re-reads the cluster every ``planner_reconcile_s`` and
plans if the inputs changed (a node whose heartbeats stopped, an event missed while down).

A plan is saved and announced only when it is news (see ``planning.needs_publish``), so
repeated passes over an unchanged cluster publish nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from services.planner.api import ClusterInputs
from services.planner.planning import QUIET, PlanDraft, needs_publish, plan_cluster, snapshot
from services.planner.settings import PlannerSettings
from shared.bus import Bus, parse_event
from shared.events import (
    CloudEvent,
    FailureDetected,
    JobStateChanged,
    JobSubmitted,
    NodeJoined,
    NodeLost,
    PlanCreated,
    PlannedJob,
)
from shared.logging import get_logger
from shared.models import Plan, now
from shared.service import ServiceBody
from shared.state import StateStore

EVENTS_SUBJECT = "unicron.events.>"
DURABLE = "planner"
TRIGGERS = frozenset(
    t.TYPE for t in (JobSubmitted, JobStateChanged, FailureDetected, NodeJoined, NodeLost)
)
RECONCILE = "reconcile"

log = get_logger(component="planner")


class Planner:
    def __init__(
        self,
        bus: Bus,
        state: StateStore,
        settings: PlannerSettings,
        clock: Callable[[], float] = now,
    ) -> None:
        self.bus = bus
        self.state = state
        self.settings = settings
        self.objective = settings.objective()
        self.clock = clock
        self._wake = asyncio.Event()
        self._triggers: list[str] = []
        self._last_inputs: ClusterInputs | None = None  # only saves work; Redis is the truth

    async def on_event(self, event: CloudEvent) -> None:
        """Bus handler: note the trigger and return, so a burst is acked at once."""
        if event.type in TRIGGERS:
            self.trigger(f"{event.type} {event.subject or ''}".rstrip())

    def trigger(self, why: str) -> None:
        self._triggers.append(why)
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        self.trigger("startup")  # converge at once after a restart, events or not
        await self.bus.consume(EVENTS_SUBJECT, DURABLE, parse_event, self.on_event)
        tasks = [asyncio.create_task(self._plan_loop()), asyncio.create_task(self._tick())]
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.settings.planner_reconcile_s)
            self.trigger(RECONCILE)

    async def _plan_loop(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.settings.planner_debounce_s)  # let the burst land
            self._wake.clear()
            triggers, self._triggers = self._triggers, []
            try:
                await self.plan_once(summarise(triggers))
            except Exception:
                # Keep the triggers; the next reconcile tick retries with fresh inputs.
                self._triggers = triggers + self._triggers
                log.exception("planning failed; will retry", triggers=len(triggers))

    async def plan_once(self, trigger: str) -> Plan | None:
        """Plan from the cluster as it is now; the published plan, or None if nothing new."""
        nodes, jobs = await asyncio.gather(self.state.list_nodes(), self.state.list_jobs())
        inputs = snapshot(nodes, jobs, self.clock(), self.settings.node_timeout_s)
        if inputs == self._last_inputs:
            return None
        # The DP is O(m·n²): off the event loop, so acks and heartbeats keep flowing.
        draft = await asyncio.to_thread(plan_cluster, inputs, self.objective)
        plan = None
        if needs_publish(draft, await self.state.latest_plan()):
            plan = await self._publish(draft, trigger)
        else:
            log.debug("nothing to change", trigger=trigger, jobs=len(inputs.jobs))
        self._last_inputs = inputs
        return plan

    async def _publish(self, draft: PlanDraft, trigger: str) -> Plan:
        plan = Plan(
            seq=await self.state.next_plan_seq(),
            epoch=0,
            trigger=trigger,
            allocations=draft.allocations,
            free_slots=draft.free_slots,
            expected_waf=draft.expected_waf,
        )
        # Saved before announced: whoever hears of the plan can read it.
        await self.state.save_plan(plan)
        await self.bus.publish_event(plan_created(plan))
        log.info(
            "plan published",
            plan_id=plan.id,
            seq=plan.seq,
            trigger=trigger,
            expected_waf=plan.expected_waf,
            free_slots=plan.free_slots,
        )
        for a in plan.allocations:
            if a.action not in QUIET:
                log.info(
                    "job planned",
                    job_id=a.job_id,
                    action=a.action.value,
                    workers=a.workers,
                    previous_workers=a.previous_workers,
                    reason=a.reason,
                )
        return plan


def plan_created(plan: Plan) -> PlanCreated:
    return PlanCreated(
        plan_id=plan.id,
        seq=plan.seq,
        epoch=plan.epoch,
        trigger=plan.trigger,
        expected_waf=plan.expected_waf,
        jobs=[
            PlannedJob(
                job_id=a.job_id,
                action=a.action,
                workers=a.workers,
                previous_workers=a.previous_workers,
            )
            for a in plan.allocations
        ],
    )


def summarise(triggers: list[str], shown: int = 3) -> str:
    """A short trigger text: the distinct triggers in order, the rest counted."""
    distinct = list(dict.fromkeys(triggers)) or [RECONCILE]
    if len(distinct) > 1 and RECONCILE in distinct:
        distinct.remove(RECONCILE)
    text = ", ".join(distinct[:shown])
    more = len(distinct) - shown
    return f"{text} (+{more} more)" if more > 0 else text


def planner_body(settings: PlannerSettings) -> ServiceBody:
    """The service body for :func:`shared.service.run_service`."""

    async def body(bus: Bus, state: StateStore, stop: asyncio.Event) -> None:
        await Planner(bus, state, settings).run(stop)

    return body
