"""Each service's own metrics, fed what the service feeds them: the events it publishes, the
reports it takes in, its GPU health reports."""

from __future__ import annotations

from unicron.services.agent.metrics import AgentMetrics
from unicron.services.detector.metrics import DetectorMetrics
from unicron.services.executor.metrics import ExecutorMetrics
from unicron.services.planner.metrics import PlannerMetrics
from unicron.shared.contracts.events import (
    FailureDetected,
    JobStateChanged,
    PlanCreated,
    TransitionCompleted,
)
from unicron.shared.contracts.models import HistoryEntry, Job, JobSpec, JobState
from unicron.shared.contracts.plans import JobAllocation, JobExplanation, ParallelConfig, Plan
from unicron.shared.contracts.reports import GpuSignal, StepCompleted
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind, RecoveryAction, Severity
from unicron.shared.contracts.transitions import PlanAction, TransitionMode
from unicron.shared.metrics import ServiceMetrics

from tests.agent.fakenvml import FakeNvml, Reports, watching
from tests.metrics.scrape import Samples, parse, value
from tests.twins.memorybus import MemoryBroker, MemoryBus


def samples(metrics: ServiceMetrics) -> Samples:
    return parse(metrics.render().decode())


def crash(**fields: object) -> FailureDetected:
    return FailureDetected.of(
        FailureCategory.EXITED_ABNORMALLY, failure_id="f1", job_id="j1", node_id="n1", rank=1,
        generation=1, kind=FailureKind.CRASH, observed_at=100.0, detected_at=100.25, **fields,
    )  # fmt: skip


async def test_the_detector_counts_each_failure_it_publishes_with_its_latency() -> None:
    bus = MemoryBus(MemoryBroker(), "unicron/detector")
    bus.metrics.part(DetectorMetrics)
    await bus.publish_event(crash())
    await bus.publish_event(crash(evidence={"escalated_from": "restart"}).model_copy(
        update={"failure_id": "f2", "action": RecoveryAction.RECONFIGURE}
    ))  # fmt: skip
    got = samples(bus.metrics)
    severity = crash().severity.value
    labels = {"kind": "crash", "category": "exited_abnormally", "severity": severity}
    assert value(got, "unicron_failures_total", **labels) == 2
    assert value(got, "unicron_detection_latency_seconds_count", kind="crash") == 2
    assert value(got, "unicron_detection_latency_seconds_sum", kind="crash") == 0.5
    assert value(got, "unicron_escalations_total", action="reconfigure") == 1


def step(generation: int, step: int, rank: int = 0, loss: float = 2.0) -> StepCompleted:
    return StepCompleted(
        job_id="j1", node_id="n1", generation=generation, rank=rank, step=step, loss=loss,
        iteration_s=0.5,
    )  # fmt: skip


def test_steps_redone_after_a_rollback_are_badput_and_new_steps_goodput() -> None:
    metrics = ServiceMetrics()
    executor = metrics.part(ExecutorMetrics)
    for report in [step(1, 1), step(1, 2), step(1, 2), step(1, 3, rank=1), step(1, 3)]:
        executor.report(report)  # the same step twice (a batch handled again) counts once
    for n in (2, 3, 4):  # generation 2 restarted from the checkpoint at step 1
        executor.report(step(2, n, loss=1.5))
    got = samples(metrics)
    assert value(got, "unicron_job_goodput_seconds_total", job="j1") == 4 * 0.5  # 1, 2, 3, 4
    assert value(got, "unicron_job_badput_seconds_total", job="j1", cause="recomputed") == 1.0
    assert value(got, "unicron_job_steps_per_second", job="j1") == 2.0
    assert value(got, "unicron_job_loss", job="j1") == 1.5
    metrics.published(JobStateChanged(job_id="j1", old=JobState.RUNNING,
                                      new=JobState.SUCCEEDED, reason="done"))  # fmt: skip
    got = samples(metrics)
    assert ("unicron_job_loss", frozenset({("job", "j1")})) not in got
    assert value(got, "unicron_job_goodput_seconds_total", job="j1") == 2.0  # totals stay
    assert value(got, "unicron_job_state_changes_total", state="SUCCEEDED") == 1
    executor.forget("j1")  # the executor's reconcile sees the finished job again: no-op


def completed(**fields: object) -> TransitionCompleted:
    base = {"job_id": "j1", "action": PlanAction.RESTART, "generation": 2, "world_size": 4,
            "resumed_step": 7, "duration_s": 1.0, "kind": TransitionMode.IN_PLACE}  # fmt: skip
    return TransitionCompleted.model_validate(base | fields)


def test_a_recovery_splits_its_downtime_into_detection_and_recovery_badput() -> None:
    metrics = ServiceMetrics()
    executor = metrics.part(ExecutorMetrics)
    job = Job(id="j1", name="j1", spec=JobSpec(name="j1"), submitted_at=10.0)
    job.history = [HistoryEntry(at=15.0, state=JobState.STARTING, reason="placed"),
                   HistoryEntry(at=22.0, state=JobState.RUNNING, reason="stepping")]  # fmt: skip
    job.state = JobState.RUNNING
    executor.transition_completed(job, completed(action=PlanAction.START, generation=1))
    executor.transition_completed(job, completed(downtime_s=3.0, phases={"detect": 0.5}))
    fell_back = completed(downtime_s=9.0, kind=TransitionMode.CHECKPOINT, fallback="no step")
    executor.transition_completed(job, fell_back)
    got = samples(metrics)
    assert value(got, "unicron_job_badput_seconds_total", job="j1", cause="waiting") == 12.0
    assert value(got, "unicron_job_badput_seconds_total", job="j1", cause="detection") == 0.5
    assert value(got, "unicron_job_badput_seconds_total", job="j1", cause="recovery") == 11.5
    assert value(got, "unicron_recoveries_total", transition="in_place") == 1
    assert value(got, "unicron_recoveries_total", transition="checkpoint") == 1
    assert value(got, "unicron_recovery_downtime_seconds_sum", transition="checkpoint") == 9.0
    assert value(got, "unicron_escalations_total", action="restart") == 1


def test_the_planner_predicts_waf_and_scales_it_by_the_measured_step_time() -> None:
    metrics = ServiceMetrics()
    planner = metrics.part(PlannerMetrics)
    why = JobExplanation(predicted_waf=8.0, new_config=ParallelConfig(iteration_s=0.5))
    allocations = [
        JobAllocation(job_id=j, workers=4, action=PlanAction.KEEP, explanation=why)
        for j in ("fast", "idle")
    ]
    plan = Plan(allocations=allocations, expected_waf=16.0)
    metrics.published(PlanCreated(plan_id=plan.id, seq=1, epoch=1, trigger="t",
                                  expected_waf=16.0, jobs=[]))  # fmt: skip
    planner.achieved(plan, {"fast": 1.0})  # twice the predicted step time; "idle" never stepped
    planner.failure_taken(crash())
    with planner.pass_seconds.time():
        pass
    got = samples(metrics)
    assert value(got, "unicron_waf", kind="predicted") == 16.0
    assert value(got, "unicron_waf", kind="achieved") == 4.0
    severity = crash().severity.value
    assert value(got, "unicron_failure_actions_total", severity=severity, action="restart") == 1
    assert value(got, "unicron_planner_pass_seconds_count") == 1


async def test_the_agent_counts_gpu_health_events_and_reads_its_spares_when_scraped() -> None:
    metrics = ServiceMetrics()
    agent = metrics.part(AgentMetrics)
    spares = [1, 2]
    agent.spares_from(lambda: len(spares))
    fake, reports = FakeNvml.h200(), Reports()
    async with watching(fake, agent.counting(reports)):
        fake.xid(0, 79)
        report = await reports.next()
    assert report.signal == GpuSignal.XID and report.severity == Severity.SEV1
    spares.pop()
    got = samples(metrics)
    assert value(got, "unicron_gpu_health_events_total", event="xid", severity="SEV1") == 1
    assert value(got, "unicron_spares_ready") == 1
