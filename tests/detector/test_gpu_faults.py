"""GPU health reports of a node's agent (``GpuHealthReport``) in the detector: a SEV1 fault fails
every job with a rank on the node, or only the rank holding the GPU where the agent could tell
whose it is, a slowdown is an advisory hint, a fault on an idle node
counts toward its quarantine, and a stale or misaddressed report changes nothing. The executor,
which reads every report, passes over them."""

from __future__ import annotations

import asyncio

import pytest
from unicron.services.detector.settings import DetectorSettings
from unicron.services.executor.progress import ProgressTracker
from unicron.shared.bus.api import EventBus
from unicron.shared.bus.delivery import ClaimRefusedError
from unicron.shared.claims import ReportClaims
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.identity import JobRank
from unicron.shared.contracts.models import JobState, NodeState
from unicron.shared.contracts.reports import (
    REPORT,
    WORKER_REPORT,
    GpuHealthReport,
    GpuSignal,
    report_subject,
)
from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.shared.store.api import JobStore

from tests.detector.conftest import Cluster, next_event, no_event
from tests.twins.memorybus import MemoryBroker, MemoryBus
from tests.twins.memorystore import MemoryKeys, MemoryStore


@pytest.fixture
def detector_settings(nats_url: str, redis_url: str) -> DetectorSettings:
    # Heartbeats never run out during a test; two faults of its own quarantine a node.
    return DetectorSettings(
        nats_url=nats_url, redis_url=redis_url, heartbeat_interval_s=30.0,
        quarantine_threshold=2, quarantine_cooldown_s=600.0,
    )  # fmt: skip


def gpu_report(node: str, category: FailureCategory, **fields: object) -> GpuHealthReport:
    signal = GpuSignal.SLOWDOWN if category == FailureCategory.STRAGGLER else GpuSignal.XID
    values: dict[str, object] = {
        "node_id": node, "boot_id": f"boot-{node}", "gpu": 3, "uuid": "GPU-3", "signal": signal,
        "category": category, "message": "Xid 48: a double-bit ECC error",
        "evidence": {"xid": 48, "event": "xid_critical_error"}, **fields,
    }  # fmt: skip
    return GpuHealthReport.model_validate(values)


async def test_a_sev1_gpu_fault_fails_every_job_with_a_rank_on_the_node(
    cluster: Cluster, bus: EventBus, state: JobStore, events: asyncio.Queue[CloudEvent]
) -> None:
    for node in ("node-0", "node-1"):
        await cluster.add_node(node)
    await cluster.add_job("job-a", ["node-1", "node-0", "node-0"])
    await cluster.add_job("job-b", ["node-0"])
    await cluster.add_job("job-c", ["node-1"])
    await bus.publish_report(gpu_report("node-0", FailureCategory.ECC))
    seen = [(await next_event(events, "failure.detected")).data for _ in range(2)]
    by_job = {f["job_id"]: f for f in seen}
    assert sorted(by_job) == ["job-a", "job-b"]
    failure = by_job["job-a"]
    assert (failure["node_id"], failure["rank"], failure["kind"]) == ("node-0", 1, "hardware")
    assert (failure["category"], failure["severity"], failure["action"]) == (
        "ecc", "SEV1", "reconfigure"
    )  # fmt: skip
    assert failure["evidence"]["xid"] == 48 and failure["evidence"]["ranks"] == [1, 2]
    assert failure["message"] == "Xid 48: a double-bit ECC error"
    for job_id in ("job-a", "job-b"):
        job = await state.get_job(job_id)
        assert job is not None and job.state == JobState.RECOVERING
    untouched = await state.get_job("job-c")
    assert untouched is not None and untouched.state == JobState.RUNNING


async def test_a_fault_on_a_gpu_the_agent_placed_fails_only_the_rank_holding_it(
    cluster: Cluster, bus: EventBus, state: JobStore, events: asyncio.Queue[CloudEvent]
) -> None:
    """The agent said whose the GPU is: the job holding it names its rank on that GPU (rank 2,
    not its lowest rank on the node), and the node's other job, on other GPUs, trains on."""
    await cluster.add_node("node-0")
    await cluster.add_job("job-a", ["node-0", "node-0", "node-0"])
    await cluster.add_job("job-b", ["node-0"])
    held = [JobRank(job_id="job-a", generation=1, rank=2)]
    await bus.publish_report(gpu_report("node-0", FailureCategory.ECC, held_by=held))
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["job_id"], failure["rank"], failure["kind"]) == ("job-a", 2, "hardware")
    assert failure["evidence"]["ranks"] == [0, 1, 2]
    await no_event(events, "failure.detected", within_s=1.0)
    untouched = await state.get_job("job-b")
    assert untouched is not None and untouched.state == JobState.RUNNING


async def test_a_sev1_fault_on_a_gpu_nobody_holds_counts_against_the_node_only(
    cluster: Cluster, bus: EventBus, state: JobStore, events: asyncio.Queue[CloudEvent]
) -> None:
    await cluster.add_node("node-0")
    await cluster.add_job("job-a", ["node-0"])
    for gpu, xid in ((1, 48), (2, 94)):  # two faults of its own quarantine it (settings)
        report = gpu_report(
            "node-0", FailureCategory.ECC, gpu=gpu, held_by=[], evidence={"xid": xid}
        )
        await bus.publish_report(report)
    changed = await next_event(events, "node.state_changed")
    assert (changed.data["node_id"], changed.data["new"]) == ("node-0", "QUARANTINED")
    await no_event(events, "failure.detected", within_s=1.0)


async def test_a_slowdown_is_an_advisory_hint_and_the_job_keeps_running(
    cluster: Cluster, bus: EventBus, state: JobStore, events: asyncio.Queue[CloudEvent]
) -> None:
    await cluster.add_node("node-0")
    await cluster.add_job("job-s", ["node-0"])
    slow = {"clock_event_reasons": "0x40", "slowdown": ["hw_thermal_slowdown"]}
    await bus.publish_report(gpu_report("node-0", FailureCategory.STRAGGLER, evidence=slow))
    hint = (await next_event(events, "failure.detected")).data
    assert (hint["category"], hint["action"], hint["kind"]) == ("straggler", "report", "hardware")
    assert hint["evidence"]["slowdown"] == ["hw_thermal_slowdown"]
    job = await state.get_job("job-s")
    assert job is not None and job.state == JobState.RUNNING and job.last_failure is None


async def test_sev1_gpu_faults_on_an_idle_node_quarantine_it(
    cluster: Cluster, bus: EventBus, state: JobStore, events: asyncio.Queue[CloudEvent]
) -> None:
    await cluster.add_node("node-0")
    await bus.publish_report(gpu_report("node-0", FailureCategory.ECC, gpu=1))
    await bus.publish_report(gpu_report("node-0", FailureCategory.GPU_DRIVER, gpu=2))
    changed = (await next_event(events, "node.state_changed")).data
    assert (changed["node_id"], changed["new"]) == ("node-0", "QUARANTINED")
    node = await state.get_node("node-0")
    assert node is not None and node.state == NodeState.QUARANTINED


async def test_a_report_from_an_earlier_boot_of_the_agent_is_ignored(
    cluster: Cluster, bus: EventBus, events: asyncio.Queue[CloudEvent]
) -> None:
    await cluster.add_node("node-0")
    await cluster.add_job("job-o", ["node-0"])
    await bus.publish_report(gpu_report("node-0", FailureCategory.ECC, boot_id="boot-before"))
    await no_event(events, "failure.detected", within_s=1.0)


async def test_a_report_about_another_node_is_refused(
    cluster: Cluster, bus: EventBus, events: asyncio.Queue[CloudEvent]
) -> None:
    await cluster.add_node("node-0")
    await cluster.add_job("job-r", ["node-0"])
    letters: asyncio.Queue[bytes] = asyncio.Queue()

    async def keep(payload: bytes) -> None:
        await letters.put(payload)

    await bus.consume("unicron.deadletter", "test-letters", lambda raw: raw, keep)
    forged = gpu_report("node-0", FailureCategory.ECC)
    subject = report_subject(forged).replace("node-0", "node-1")  # as node-1's agent
    await bus._publish(subject, forged.model_dump_json().encode())
    async with asyncio.timeout(5):
        letter = await letters.get()
    assert b"refused: a report about node 'node-0' sent as node 'node-1'" in letter
    await no_event(events, "failure.detected", within_s=0.5)


async def test_the_executor_reads_a_gpu_report_and_passes_over_it() -> None:
    store = MemoryStore(MemoryKeys())
    report = gpu_report("node-0", FailureCategory.ECC)
    parsed = REPORT.validate_json(report.model_dump_json())  # its parser of every report
    assert parsed == report
    claims = ReportClaims(store)
    await claims.check(report_subject(report), parsed)
    with pytest.raises(ClaimRefusedError, match="sent as node 'node-1'"):
        await claims.check("unicron.reports.node-1.gpu_health", parsed)
    await ProgressTracker(MemoryBus(MemoryBroker(), "unicron/executor"), store).on_report(parsed)  # type: ignore[arg-type]
    assert await store.list_jobs() == []


def test_a_worker_cannot_send_a_gpu_report() -> None:
    with pytest.raises(ValueError, match="gpu_health"):
        WORKER_REPORT.validate_json(gpu_report("node-0", FailureCategory.ECC).model_dump_json())
