"""The executor's metrics: recoveries and their downtime by transition kind, in-place
transitions escalated to a checkpoint restart, and each job's steps per second, loss, goodput
and badput.

Goodput and badput account for a job's wall-clock time (docs/design.md, "Metrics"): rank 0's
step time of a step beyond the highest the job completed is goodput; of a step at or below it
(redone after a rollback to a checkpoint) badput ``recomputed``. A transition that answers a
failure adds ``detection`` (fault observed -> ``failure.detected``) and ``recovery`` (the rest of
its downtime, up to the new generation's first step); one that answers none (a start, a resize,
a start after waiting for capacity) adds ``waiting``: from when the job last stopped training
(or was submitted) to that first step.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram
from unicron.shared.contracts.events import EventData, JobStateChanged, TransitionCompleted
from unicron.shared.contracts.models import Job, JobState
from unicron.shared.contracts.reports import AnyReport, StepCompleted
from unicron.shared.contracts.taxonomy import RecoveryAction
from unicron.shared.metrics import ServiceMetrics

DOWNTIME_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


@dataclass
class _Progress:
    """Rank 0's latest step of a job as this executor saw it."""

    generation: int
    step: int
    highest: int


class ExecutorMetrics:
    def __init__(self, metrics: ServiceMetrics) -> None:
        registry = metrics.registry
        self.recoveries = Counter(
            "unicron_recoveries", "Recoveries completed (the new generation stepped)",
            ["transition"], registry=registry,
        )  # fmt: skip
        self.downtime = Histogram(
            "unicron_recovery_downtime_seconds",
            "Fault observed -> the new generation's first step", ["transition"],
            buckets=DOWNTIME_BUCKETS, registry=registry,
        )  # fmt: skip
        self.escalations = Counter(
            "unicron_escalations", "Failed recoveries escalated, by the action escalated to",
            ["action"], registry=registry,
        )  # fmt: skip
        self.steps_per_second = Gauge(
            "unicron_job_steps_per_second", "Optimizer steps per second at rank 0's latest step",
            ["job"], registry=registry,
        )  # fmt: skip
        self.loss = Gauge("unicron_job_loss", "Loss at rank 0's latest step", ["job"],
                          registry=registry)  # fmt: skip
        self.goodput = Counter(
            "unicron_job_goodput_seconds", "Seconds of a job's training that advanced it",
            ["job"], registry=registry,
        )  # fmt: skip
        self.badput = Counter(
            "unicron_job_badput_seconds", "Seconds of a job's lost to a cause (no training)",
            ["job", "cause"], registry=registry,
        )  # fmt: skip
        self._progress: dict[str, _Progress] = {}
        metrics.watch(self.published)

    def report(self, report: AnyReport) -> None:
        """A worker report the executor took in: rank 0's steps move the job's figures."""
        if not isinstance(report, StepCompleted) or report.rank != 0:
            return
        job = report.job_id
        seen = self._progress.get(job)
        if seen is not None and (seen.generation, seen.step) == (report.generation, report.step):
            return  # the same report again (a batch handled once more)
        highest = seen.highest if seen is not None else report.step - 1
        if report.step > highest:
            self.goodput.labels(job).inc(report.iteration_s)
        else:
            self.badput.labels(job, "recomputed").inc(report.iteration_s)
        self._progress[job] = _Progress(report.generation, report.step, max(highest, report.step))
        if report.iteration_s > 0:
            self.steps_per_second.labels(job).set(1.0 / report.iteration_s)
        self.loss.labels(job).set(report.loss)

    def transition_completed(self, job: Job, event: TransitionCompleted) -> None:
        kind = event.kind.value if event.kind is not None else "none"
        if event.downtime_s is None:
            self.badput.labels(job.id, "waiting").inc(_waited(job, event.duration_s))
            return
        self.recoveries.labels(kind).inc()
        self.downtime.labels(kind).observe(event.downtime_s)
        detect = min(event.phases.get("detect", 0.0), event.downtime_s)
        self.badput.labels(job.id, "detection").inc(detect)
        self.badput.labels(job.id, "recovery").inc(event.downtime_s - detect)
        if event.fallback is not None:  # the in-place answer failed: every rank restarted
            self.escalations.labels(RecoveryAction.RESTART.value).inc()

    def published(self, data: EventData) -> None:
        if isinstance(data, JobStateChanged) and data.new.terminal:
            self.forget(data.job_id)

    def forget(self, job_id: str) -> None:
        """Drop a finished job's gauges (it steps no more); its counters keep their totals."""
        if self._progress.pop(job_id, None) is None:
            return  # never stepped here, or forgotten already
        for gauge in (self.steps_per_second, self.loss):
            with contextlib.suppress(KeyError):
                gauge.remove(job_id)


def _waited(job: Job, duration_s: float) -> float:
    """From when ``job`` last stopped training (or was submitted) to its generation's first
    step, which its history's last entry records (RUNNING); at least the transition's own
    ``duration_s``."""
    history = job.history[:-1] if job.history and job.state == JobState.RUNNING else job.history
    stopped = job.submitted_at
    for before, after in itertools.pairwise(history):
        if before.state == JobState.RUNNING and after.state != JobState.RUNNING:
            stopped = after.at
    first_step = job.history[-1].at if job.history else stopped + duration_s
    return max(duration_s, first_step - stopped)
