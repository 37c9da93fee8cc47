"""GPU health in the agent through NVML (issue 21, item 4): each health event — an Xid of each
class, a double-bit ECC error, pages or rows waiting for a reset, a lost GPU, a slowdown —
becomes one node-level report with its evidence and the severity the taxonomy gives it. NVML is
the recorded H200 of docs/gpu-probe.md §8 (``tests/agent/fakenvml.py``), driven through the
same code path as the real binding."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs
from unicron.shared.contracts.reports import GpuHealthReport, GpuSignal
from unicron.shared.contracts.taxonomy import FailureCategory, RecoveryAction, Severity, severity_of

from tests.agent.conftest import until
from tests.agent.fakenvml import BOOT, FakeNvml, looks, watching

H200_UUID = "GPU-ffdc4ba6-2cf9-2de4-19e4-9f0341e99ef6"


def sev1(report: GpuHealthReport, category: FailureCategory) -> None:
    assert (report.node_id, report.boot_id) == ("n1", BOOT)
    assert report.category == category and report.severity == Severity.SEV1
    assert severity_of(report.category) == (Severity.SEV1, RecoveryAction.RECONFIGURE)


async def test_the_recorded_h200_is_healthy_and_the_watch_closes_nvml() -> None:
    fake = FakeNvml.h200()
    async with watching(fake) as reports:
        await looks(fake, 3)
        assert reports.queue.empty()
        assert fake.registered == {0: 0x8 | 0x2 | 0x4000}  # Xid, double-bit ECC, unavailable
    assert (fake.shutdowns, fake.sets_freed, fake.initialised) == (1, 1, False)


@pytest.mark.parametrize(
    ("xid", "category"),
    [(48, FailureCategory.ECC), (63, FailureCategory.ECC), (64, FailureCategory.ECC),
     (74, FailureCategory.NVLINK), (79, FailureCategory.GPU_DRIVER), (92, FailureCategory.ECC),
     (94, FailureCategory.ECC), (95, FailureCategory.ECC)],
)  # fmt: skip
async def test_each_sev1_xid_is_a_report_with_its_xid(xid: int, category: FailureCategory) -> None:
    fake = FakeNvml.h200()
    async with watching(fake) as reports:
        fake.xid(0, xid)
        report = await reports.next()
    sev1(report, category)
    assert (report.signal, report.gpu, report.uuid) == (GpuSignal.XID, 0, H200_UUID)
    assert report.evidence == {"xid": xid, "event": "xid_critical_error"}
    assert report.message.startswith(f"Xid {xid}: ")


async def test_an_application_xid_is_logged_not_reported() -> None:
    fake = FakeNvml.h200()
    with capture_logs() as logs:
        async with watching(fake) as reports:
            fake.xid(0, 13)  # a graphics engine exception: the application's own fault
            fake.xid(0, 79)
            report = await reports.next()
    assert report.evidence["xid"] == 79 and reports.queue.empty()
    skipped = [e for e in logs if e["event"] == "GPU event not reported"]
    assert [(e["gpu"], e["data"]) for e in skipped] == [(0, 13)]


async def test_a_double_bit_ecc_event_is_an_ecc_report() -> None:
    fake = FakeNvml.h200()
    async with watching(fake) as reports:
        fake.event(0, "DoubleBitEccError")
        report = await reports.next()
    sev1(report, FailureCategory.ECC)
    assert (report.signal, report.evidence) == (
        GpuSignal.ECC_DOUBLE_BIT,
        {"event": "double_bit_ecc"},
    )


def ecc_counts(uncorrected: int) -> dict[str, dict[str, int]]:
    return {
        "corrected": {"volatile": 0, "aggregate": 0},
        "uncorrected": {"volatile": uncorrected, "aggregate": uncorrected},
    }


async def test_a_rise_in_the_uncorrected_ecc_count_is_reported_once_per_rise() -> None:
    fake = FakeNvml.h200()
    async with watching(fake) as reports:
        fake.answer(0, "total_ecc_errors", ecc_counts(2))
        first = await reports.next()
        await looks(fake)
        assert reports.queue.empty()  # the same count again is no news
        fake.answer(0, "total_ecc_errors", ecc_counts(3))
        second = await reports.next()
    sev1(first, FailureCategory.ECC)
    assert first.signal == GpuSignal.ECC_DOUBLE_BIT
    assert first.evidence == {"ecc_uncorrected_volatile": 2, "before": 0}
    assert second.evidence == {"ecc_uncorrected_volatile": 3, "before": 2}


async def test_an_error_count_already_there_at_start_is_reported() -> None:
    fake = FakeNvml.h200()
    fake.answer(0, "total_ecc_errors", ecc_counts(1))
    async with watching(fake) as reports:
        report = await reports.next()
    assert report.evidence == {"ecc_uncorrected_volatile": 1, "before": None}


async def test_pages_waiting_for_retirement_are_reported() -> None:
    fake = FakeNvml.h200()  # the H200 does not support the query: an older GPU does
    async with watching(fake) as reports:
        await looks(fake)
        fake.answer(0, "retired_pages_pending_status", 1)
        report = await reports.next()
    sev1(report, FailureCategory.ECC)
    assert report.signal == GpuSignal.RETIREMENT_PENDING
    assert report.evidence == {"retired_pages_pending": True}


@pytest.mark.parametrize(
    ("rows", "words"),
    [([0, 1, 1, 0], "remapped rows wait for a GPU reset"), ([0, 1, 0, 1], "row remapping failed")],
)
async def test_rows_waiting_for_a_remap_or_failing_one_are_reported(
    rows: list[int], words: str
) -> None:
    fake = FakeNvml.h200()
    async with watching(fake) as reports:
        fake.answer(0, "remapped_rows", rows)
        report = await reports.next()
    sev1(report, FailureCategory.ECC)
    assert (report.signal, report.message) == (GpuSignal.REMAP_PENDING, words)
    assert report.evidence == {
        "remapped_rows_corrected": 0, "remapped_rows_uncorrected": 1,
        "remap_pending": bool(rows[2]), "remap_failure": bool(rows[3]),
    }  # fmt: skip


async def test_a_lost_gpu_is_reported_once() -> None:
    fake = FakeNvml.h200()
    async with watching(fake) as reports:
        fake.gpus[0].lost = True  # every query now answers NVML_ERROR_GPU_IS_LOST
        report = await reports.next()
        await looks(fake, 3)
        assert reports.queue.empty()
    sev1(report, FailureCategory.GPU_DRIVER)
    assert (report.signal, report.gpu) == (GpuSignal.GPU_LOST, 0)
    assert report.evidence == {"error": "NVML_ERROR_GPU_IS_LOST"}


async def test_a_gpu_lost_before_the_agent_started_is_reported_at_its_first_look() -> None:
    fake = FakeNvml.h200()
    fake.gpus[0].lost = True
    async with watching(fake) as reports:
        report = await reports.next()
    sev1(report, FailureCategory.GPU_DRIVER)
    assert (report.signal, report.gpu, report.uuid) == (GpuSignal.GPU_LOST, 0, None)
    assert fake.registered == {}  # nothing left to register it for


async def test_the_gpu_unavailable_event_is_a_lost_gpu() -> None:
    fake = FakeNvml.h200()
    async with watching(fake) as reports:
        fake.event(0, "GpuUnavailableError")
        report = await reports.next()
    sev1(report, FailureCategory.GPU_DRIVER)
    assert (report.signal, report.gpu, report.evidence) == (
        GpuSignal.GPU_LOST, 0, {"event": "gpu_unavailable"}
    )  # fmt: skip


async def test_an_event_wait_that_finds_a_gpu_lost_reports_it_once_for_the_node() -> None:
    fake = FakeNvml.h200()
    async with watching(fake) as reports:
        for _ in range(3):
            fake.fail_wait("GPUIsLost")
        report = await reports.next()
        await until(lambda: fake.events.empty())
        await looks(fake)
        assert reports.queue.empty()
    sev1(report, FailureCategory.GPU_DRIVER)
    assert (report.signal, report.gpu, report.uuid) == (GpuSignal.GPU_LOST, None, None)


async def test_a_hardware_slowdown_is_an_advisory_straggler_hint() -> None:
    fake = FakeNvml.h200()
    async with watching(fake) as reports:
        fake.answer(0, "clocks_event_reasons", 0x4)  # the software power cap: how a GPU runs
        await looks(fake)
        assert reports.queue.empty()
        fake.answer(0, "clocks_event_reasons", 0x4 | 0x40 | 0x8)
        report = await reports.next()
    assert (report.signal, report.category) == (GpuSignal.SLOWDOWN, FailureCategory.STRAGGLER)
    assert severity_of(report.category)[1] == RecoveryAction.REPORT
    assert report.evidence == {
        "clock_event_reasons": "0x4c", "slowdown": ["hw_slowdown", "hw_thermal_slowdown"],
    }  # fmt: skip
