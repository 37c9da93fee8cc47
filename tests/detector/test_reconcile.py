"""The detector's reconcile: a failed worker whose report never came is still recorded, but a
report that is only late still names the cause (the executor marks a worker failed from the
same exit report the detector is about to read)."""

from __future__ import annotations

import asyncio
import signal

from unicron.services.detector.service import Detector
from unicron.services.detector.settings import DetectorSettings
from unicron.shared.bus.api import EventBus
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import Job, WorkerState
from unicron.shared.contracts.reports import WorkerExited
from unicron.shared.store.api import JobStore

from tests.detector.conftest import Cluster, next_event


async def job_with_a_failed_rank(bus: EventBus, state: JobStore) -> None:
    cluster = Cluster(bus, state)
    await cluster.add_node("node-0")
    await cluster.add_job("job-r", ["node-0", "node-0"], generation=3)

    def rank_1_failed(job: Job) -> None:
        job.workers[1].state = WorkerState.FAILED  # as the executor writes it from the exit

    await state.update_job("job-r", rank_1_failed)


async def test_a_failed_worker_no_report_named_is_recorded_on_the_second_look(
    bus: EventBus,
    state: JobStore,
    detector_settings: DetectorSettings,
    events: asyncio.Queue[CloudEvent],
) -> None:
    await job_with_a_failed_rank(bus, state)
    detector = Detector(bus, state, detector_settings)

    await detector.reconcile()
    await asyncio.sleep(detector_settings.correlation_window_s * 3)
    assert events.empty()  # its report may still be on its way
    job = await state.get_job("job-r")
    assert job is not None and job.last_failure is None

    await detector.reconcile()
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["rank"], failure["generation"], failure["category"]) == (
        1, 3, "exited_abnormally",
    )  # fmt: skip
    assert failure["evidence"]["found_by"] == "reconcile"
    await detector.correlator.close()


async def test_a_late_exit_report_names_its_signal_not_the_reconcile(
    bus: EventBus,
    state: JobStore,
    detector_settings: DetectorSettings,
    events: asyncio.Queue[CloudEvent],
) -> None:
    await job_with_a_failed_rank(bus, state)
    detector = Detector(bus, state, detector_settings)

    await detector.reconcile()
    await detector.on_report(
        WorkerExited(
            node_id="node-0", job_id="job-r", generation=3, rank=1, pid=1001, exit_code=None,
            signal=signal.SIGSEGV,
        )
    )  # fmt: skip
    await detector.reconcile()  # sees it again while the report waits out its window
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["kind"], failure["exc_type"], failure["category"]) == (
        "crash", "SIGSEGV", "software_other",
    )  # fmt: skip
    assert "found_by" not in failure["evidence"]
    await detector.correlator.close()
