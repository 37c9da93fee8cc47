"""Feedback: what the cluster reports, turned into calibration (see :mod:`.calibration`).

- step reports (rank 0 only, warm-up steps left out) are summed in memory per job and folded
  into the job's slowdown at each :meth:`Feedback.flush` — one Redis write per job per
  reconcile tick, however fast the job steps;
- ``transition.completed``: the measured duration (transition start → first step) against the
  prediction the plan that launched the generation recorded (before calibration), per kind;
- ``failure.detected``: one failure for the rate estimate, once per failure id;
- :meth:`Feedback.exposure`: the GPU-hours the running jobs accumulated.
"""

from __future__ import annotations

from dataclasses import dataclass

from unicron.planning.api import JobDemand, TransitionKind
from unicron.planning.throughput import MegatronThroughput
from unicron.services.planner.calibration import CalibrationStore
from unicron.shared.contracts.events import FailureDetected, TransitionCompleted
from unicron.shared.contracts.models import now
from unicron.shared.contracts.reports import StepCompleted, StepsCompleted
from unicron.shared.logging import get_logger
from unicron.shared.store.state import StateStore

log = get_logger(component="planner.feedback")
UNCALIBRATED = frozenset({TransitionKind.NONE, TransitionKind.STOP})


@dataclass
class _Steps:
    generation: int
    seconds: float = 0.0
    count: int = 0


class Feedback:
    def __init__(
        self, state: StateStore, store: CalibrationStore, model: MegatronThroughput | None
    ) -> None:
        self.state = state
        self.store = store
        self.model = model  # None: the throughput model has no step times to calibrate
        self._steps: dict[str, _Steps] = {}
        self._seen: set[tuple[str, int]] = set()  # (job, generation) whose warm-up step passed

    async def on_steps(self, batch: StepsCompleted) -> None:
        """Bus handler for a node's batch of steps: its rank 0's, if it holds it."""
        for step in batch.steps:
            await self.on_report(step)

    async def on_report(self, report: object) -> None:
        """Bus handler for ``unicron.reports.*.step_completed``: remember, write later."""
        if not isinstance(report, StepCompleted) or report.rank != 0 or self.model is None:
            return
        key = (report.job_id, report.generation)
        if report.resumed_from is not None or key not in self._seen:
            self._seen.add(key)  # the first step of a generation pays for start-up
            return
        steps = self._steps.get(report.job_id)
        if steps is None or steps.generation != report.generation:
            steps = self._steps[report.job_id] = _Steps(report.generation)
        steps.seconds += report.iteration_s
        steps.count += 1

    def step_times(self) -> dict[str, float]:
        """The mean step time of each job that stepped since the last :meth:`flush`."""
        return {job_id: s.seconds / s.count for job_id, s in self._steps.items() if s.count}

    async def flush(self) -> None:
        pending, self._steps = self._steps, {}
        for job_id, steps in pending.items():
            job = await self.state.get_job(job_id)
            if job is None or job.generation != steps.generation or job.world_size < 1:
                continue
            assert self.model is not None
            modelled = self.model.modelled_iteration_s(
                JobDemand.of(job.id, job.spec), job.world_size
            )
            if not 0 < modelled < float("inf"):
                continue
            ratio = steps.seconds / steps.count / modelled
            slowdown = await self.store.job_steps(job_id, ratio, steps.count, now())
            log.debug("job calibrated", job_id=job_id, slowdown=slowdown, steps=steps.count)

    async def on_transition(self, event_id: str, data: TransitionCompleted) -> None:
        job = await self.state.get_job(data.job_id)
        if job is None or job.plan_id is None or job.generation != data.generation:
            return
        plan = await self.state.get_plan(job.plan_id)
        allocation = plan.for_job(job.id) if plan else None
        why = allocation.explanation if allocation else None
        if why is None or TransitionKind(why.transition) in UNCALIBRATED:
            return
        modelled = why.predicted_downtime_s / (why.downtime_factor or 1.0)
        # The transition's own time, from the executor starting it to the first step: the
        # downtime since the fault also counts detection and planning, which every plan pays
        # alike and D_trans does not price (a node loss's 3 s of missed heartbeats would read
        # as a shrink 100x dearer than it is).
        observed = data.duration_s
        if modelled <= 0 or not await self.state.once(f"planner:transition:{event_id}"):
            return
        factor = await self.store.transition(TransitionKind(why.transition), observed, modelled)
        log.info(
            "transition calibrated",
            job_id=job.id,
            kind=why.transition,
            observed_s=round(observed, 3),
            modelled_s=round(modelled, 3),
            factor=round(factor, 3),
        )

    async def on_failure(self, data: FailureDetected) -> bool:
        """Count the failure for the rate estimate; False when it was counted before."""
        if not await self.state.once(f"planner:failure:{data.failure_id}"):
            return False
        await self.store.failure(data.detected_at)
        return True

    async def exposure(self, gpus: int) -> None:
        await self.store.exposure(gpus, now())

    def forget(self, job_id: str) -> None:
        self._steps.pop(job_id, None)
        self._seen = {k for k in self._seen if k[0] != job_id}
