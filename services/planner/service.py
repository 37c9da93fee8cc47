"""The planner service: one active instance under a lease; triggers in, plans out.

Lifecycle: an instance stands by until it takes the ``planner`` lease (shared/store/lease.py), then
serves a *term*: it subscribes to the events and step reports, plans, and stamps every plan
with the lease's fencing epoch; when the lease is lost it drops its subscriptions and stands
by again. A killed active instance is replaced by a standby within the lease's TTL, and
the executor refuses any plan whose epoch is older than the lease's.

Level-triggered: every planning pass rebuilds its inputs from Redis (records and calibration),
so events only say *when* to look, never *what* is true. Event handlers mark the planner dirty
and return at once; one planning task waits ``planner_debounce_s`` after the first trigger and
plans once for the whole burst. A reconcile tick re-reads the cluster every
``planner_reconcile_s`` and plans if the inputs changed, naming what it saw change (under the
``aging`` policy a waiting job's counted wait is an input, so it changes once an aging step). A
plan is saved and announced only when it is news (``unicron.planning.planning.needs_publish``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from unicron.planning.api import ClusterInputs
from unicron.planning.planning import PlanDraft, needs_publish, plan_cluster, snapshot
from unicron.planning.throughput import MegatronThroughput
from unicron.services.planner.calibration import CalibrationStore
from unicron.services.planner.feedback import Feedback
from unicron.services.planner.metrics import PlannerMetrics
from unicron.services.planner.publish import announce, changes, summarise
from unicron.services.planner.settings import PlannerSettings
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.bus.streams import ALL_EVENTS, reports_of_kind
from unicron.shared.contracts import events
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import now
from unicron.shared.contracts.plans import Plan
from unicron.shared.contracts.reports import WORKER_REPORT, StepsCompleted
from unicron.shared.logging import get_logger
from unicron.shared.outage import Outage
from unicron.shared.service import ServiceBody
from unicron.shared.store.lease import PLANNER_LEASE
from unicron.shared.store.state import StateStore
from unicron.shared.terms import hold_term, serve_terms

STEPS_SUBJECT = reports_of_kind("step_completed")  # an agent of an earlier release's
STEP_BATCHES_SUBJECT = reports_of_kind("steps_completed")
DURABLE = "planner"
TRIGGERS = frozenset(
    t.TYPE
    for t in (
        events.JobSubmitted, events.JobStateChanged, events.FailureDetected,
        events.NodeJoined, events.NodeLost, events.NodeStateChanged,
    )
)  # fmt: skip
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
        self.rules = settings.rules()
        self.clock = clock
        ttl = settings.planner_lease_ttl_s
        self.lease = state.lease(PLANNER_LEASE, ttl, instance=settings.planner_instance)
        store = CalibrationStore(
            state.calibration, settings.failure_prior, settings.planner_calibration_alpha
        )
        model = self.objective.throughput
        self.calibration = store
        steps = model if isinstance(model, MegatronThroughput) else None
        self.feedback = Feedback(state, store, steps)
        self.metrics = bus.metrics.part(PlannerMetrics)
        self._wake = asyncio.Event()
        self._triggers: list[str] = []
        self._last_inputs: ClusterInputs | None = None  # only saves work; Redis is the truth

    async def on_event(self, event: CloudEvent) -> None:
        """Bus handler: note the trigger and return, so a burst is acked at once."""
        if event.type in TRIGGERS:
            self.trigger(f"{event.type} {event.subject or ''}".rstrip())
        data = event.typed()
        if isinstance(data, events.TransitionCompleted):
            await self.feedback.on_transition(event.id, data)
        elif isinstance(data, events.FailureDetected):
            if await self.feedback.on_failure(data):
                self.metrics.failure_taken(data)
        elif isinstance(data, events.JobStateChanged) and data.new.terminal:
            self.feedback.forget(data.job_id)
            await self.calibration.forget_job(data.job_id)

    def trigger(self, why: str) -> None:
        self._triggers.append(why)
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Stand by, serve a term while the lease is ours, stand by again (shared/terms.py)."""
        await serve_terms(self.lease, lambda: self._term(stop), stop)

    async def _term(self, stop: asyncio.Event) -> None:
        log.info("planner active", epoch=self.lease.epoch, holder=self.lease.holder)
        self._last_inputs = None
        self.trigger(f"planner active (epoch {self.lease.epoch})")  # converge at once
        await hold_term(
            self.lease, stop, [self._plan_loop, self._tick], self._connect, self._subscribe
        )
        if not stop.is_set():
            log.warning("planner standing by: lease lost", epoch=self.lease.epoch)

    async def _connect(self) -> Bus:
        return await Bus.connect(
            self.settings.nats_url, "unicron/planner", access=self.settings.nats_access,
            metrics=self.bus.metrics,
        )  # fmt: skip

    async def _subscribe(self, term_bus: Bus) -> None:
        await term_bus.consume(ALL_EVENTS, DURABLE, parse_event, self.on_event)
        await term_bus.consume(
            STEPS_SUBJECT, "planner-steps", WORKER_REPORT.validate_json,
            self.feedback.on_report, deliver_new=True,
        )  # fmt: skip
        await term_bus.consume(
            STEP_BATCHES_SUBJECT, "planner-step-batches", StepsCompleted.model_validate_json,
            self.feedback.on_steps, deliver_new=True,
        )  # fmt: skip

    async def _tick(self) -> None:
        outage = Outage("calibration update", component="planner")
        while True:
            await asyncio.sleep(max(self.settings.planner_reconcile_s, outage.delay()))
            try:
                self.metrics.achieved(await self.state.latest_plan(), self.feedback.step_times())
                await self.feedback.flush()
                await self.feedback.exposure(self._busy_gpus())
                outage.ok()
            except Exception as exc:
                outage.failed(exc)
            self.trigger(RECONCILE)

    def _busy_gpus(self) -> int:
        inputs = self._last_inputs
        return sum(v.world_size for v in inputs.jobs if v.active) if inputs else 0

    async def _plan_loop(self) -> None:
        outage = Outage("planning", component="planner")
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.settings.planner_debounce_s)  # let the burst land
            await outage.pause()
            self._wake.clear()
            triggers, self._triggers = self._triggers, []
            try:
                with self.metrics.pass_seconds.time():
                    await self.plan_once(summarise(triggers, RECONCILE))
                outage.ok()
            except Exception as exc:
                # Keep the triggers and try again after the back-off, not at the next tick: a
                # failure waiting for this plan must not wait for Redis and then a tick more.
                self._triggers = triggers + self._triggers
                outage.failed(exc)
                self._wake.set()

    async def inputs(self) -> ClusterInputs:
        nodes, jobs, calibration = await asyncio.gather(
            self.state.list_nodes(), self.state.list_jobs(), self.calibration.snapshot()
        )
        if self.settings.planner_run_s is not None:  # a fixed D_run overrides the estimate
            calibration = replace(calibration, failure_rate_per_gpu_h=None)
        return snapshot(nodes, jobs, self.clock(), calibration, self.rules)

    async def plan_once(self, trigger: str) -> Plan | None:
        """Plan from the cluster as it is now; the published plan, or None if nothing new."""
        inputs = await self.inputs()
        if inputs == self._last_inputs:
            return None
        if trigger == RECONCILE and self._last_inputs is not None:
            trigger = changes(self._last_inputs, inputs) or trigger
        # The DP is O(m·n²): off the event loop, so acks and heartbeats keep flowing.
        draft = await asyncio.to_thread(plan_cluster, inputs, self.objective, self.rules)
        plan = None
        if not self.lease.held():
            log.warning("lease not held; plan dropped", trigger=trigger)
            return None
        latest = await self.state.latest_plan()
        if latest is not None and latest.epoch < self.lease.epoch:
            latest = None  # a fenced term's plan was refused: it is nobody's latest to repeat
        if needs_publish(draft, latest):
            plan = await self._publish(draft, trigger, inputs)
        else:
            log.debug("nothing to change", trigger=trigger, jobs=len(inputs.jobs))
        self._last_inputs = inputs
        return plan

    async def _publish(self, draft: PlanDraft, trigger: str, inputs: ClusterInputs) -> Plan:
        plan = Plan(
            seq=await self.state.next_plan_seq(),
            epoch=self.lease.epoch,
            trigger=trigger,
            allocations=draft.allocations,
            free_slots=draft.free_slots,
            expected_waf=draft.expected_waf,
            expected_reward=draft.expected_reward,
            cluster=self.settings.planner_cluster,
            unit_slots=draft.unit,
            run_s=draft.run_s,
            failure_rate_per_gpu_h=inputs.calibration.failure_rate_per_gpu_h,
            planning_ms=draft.planning_ms,
            fairness=draft.fairness,
        )
        # Saved before announced: whoever hears of the plan can read it.
        await self.state.save_plan(plan)
        await announce(self.bus, plan)
        return plan


def planner_body(settings: PlannerSettings) -> ServiceBody:
    """The service body for :func:`unicron.shared.service.run_service`."""

    async def body(bus: Bus, state: StateStore, stop: asyncio.Event) -> None:
        await Planner(bus, state, settings).run(stop)

    return body
