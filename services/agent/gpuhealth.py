"""The node's GPU health, watched through NVML: Xid critical errors, double-bit ECC errors,
pages or rows waiting for a reset, a lost GPU and slowdowns, each one ``GpuHealthReport`` on the
bus (docs/design.md §3, "GPU health").

Two ways in. A thread waits on NVML's event set (Xid, double-bit ECC, "GPU unavailable") with a
timeout, so that it sees a stop, and hands each event to the event loop. Every
``UNICRON_GPU_HEALTH_S`` each GPU's counters are read in a thread and compared with the last
look: a counter is reported when it rises, a pending reset or a slowdown when it begins, a lost
GPU once. The first look compares with nothing, so a GPU that already counts an uncorrectable
error, or waits for a reset, when the agent starts is reported then.

The category of each comes from :data:`XID_FAULTS` or the kind of signal, and the severity and
action from the taxonomy: all SEV1 (the node is at fault) but a slowdown, an advisory straggler
hint. An Xid outside the table is logged, not reported: NVIDIA's catalogue puts most of those on
the application (13, 31, 43, 45 …), and the worker reports its own CUDA error.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Protocol

from unicron.services.agent.nvml import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_GPU_UNAVAILABLE,
    EVENT_XID,
    SLOWDOWN_REASONS,
    EventSeen,
    Gpu,
    GpuReading,
    NvmlLoader,
    NvmlUnavailableError,
    Session,
    import_pynvml,
    open_session,
    read_gpu,
    wait_event,
)
from unicron.shared.contracts.reports import EvidenceValue, GpuHealthReport, GpuSignal
from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.shared.logging import get_logger

_ECC, _NVLINK, _DRIVER = FailureCategory.ECC, FailureCategory.NVLINK, FailureCategory.GPU_DRIVER
# The Xids that say the GPU itself is faulty (NVIDIA's Xid catalogue), and what each means.
XID_FAULTS: dict[int, tuple[FailureCategory, str]] = {
    48: (_ECC, "a double-bit ECC error"),
    63: (_ECC, "an ECC page retirement or row remapping was recorded"),
    64: (_ECC, "an ECC page retirement or row remapping failed"),
    74: (_NVLINK, "an NVLink error"),
    79: (_DRIVER, "the GPU has fallen off the bus"),
    92: (_ECC, "a high single-bit ECC error rate"),
    94: (_ECC, "a contained ECC error"),
    95: (_ECC, "an uncontained ECC error"),
}
EVENT_WAIT_MS = 500  # how long an NVML event wait blocks: the event thread sees a stop this soon


@dataclass(frozen=True)
class Finding:
    """What one event or one change between looks says about a GPU."""

    signal: GpuSignal
    category: FailureCategory
    message: str
    evidence: dict[str, EvidenceValue] = field(default_factory=dict)


def event_finding(seen: EventSeen) -> Finding | None:
    """The finding of an NVML event; None for an Xid that is not the GPU's fault."""
    if seen.type == EVENT_XID:
        fault = XID_FAULTS.get(seen.data)
        if fault is None:
            return None
        category, words = fault
        evidence: dict[str, EvidenceValue] = {"xid": seen.data, "event": "xid_critical_error"}
        return Finding(GpuSignal.XID, category, f"Xid {seen.data}: {words}", evidence)
    if seen.type == EVENT_DOUBLE_BIT_ECC:
        return Finding(
            GpuSignal.ECC_DOUBLE_BIT, _ECC, "a double-bit ECC error", {"event": "double_bit_ecc"}
        )
    if seen.type == EVENT_GPU_UNAVAILABLE:
        words = "the GPU is unavailable"
        return Finding(GpuSignal.GPU_LOST, _DRIVER, words, {"event": "gpu_unavailable"})
    return None


def _slowdowns(reasons: int | None) -> set[str]:
    return {name for bit, name in SLOWDOWN_REASONS.items() if (reasons or 0) & bit}


def changes(before: GpuReading | None, now: GpuReading) -> list[Finding]:
    """What the look ``now`` found that the look ``before`` (None: none yet) had not."""
    was = before or GpuReading()
    if now.lost:
        if was.lost:
            return []
        evidence: dict[str, EvidenceValue] = {"error": "NVML_ERROR_GPU_IS_LOST"}
        return [Finding(GpuSignal.GPU_LOST, _DRIVER, "NVML answers that the GPU is lost", evidence)]
    found = []
    count = now.ecc_uncorrected or 0
    if count > (was.ecc_uncorrected or 0):
        found.append(Finding(
            GpuSignal.ECC_DOUBLE_BIT, _ECC,
            f"{count} uncorrectable ECC error(s) since the GPU was last reset",
            {"ecc_uncorrected_volatile": count, "before": was.ecc_uncorrected},
        ))  # fmt: skip
    if now.retirement_pending and not was.retirement_pending:
        evidence = {"retired_pages_pending": True}
        words = "retired memory pages wait for a GPU reset"
        found.append(Finding(GpuSignal.RETIREMENT_PENDING, _ECC, words, evidence))
    if now.remapped is not None:
        corrected, uncorrected, pending, failed = now.remapped
        _, _, was_pending, was_failed = was.remapped or (0, 0, False, False)
        if (pending and not was_pending) or (failed and not was_failed):
            words = "row remapping failed" if failed else "remapped rows wait for a GPU reset"
            evidence = {
                "remapped_rows_corrected": corrected, "remapped_rows_uncorrected": uncorrected,
                "remap_pending": pending, "remap_failure": failed,
            }  # fmt: skip
            found.append(Finding(GpuSignal.REMAP_PENDING, _ECC, words, evidence))
    slow = sorted(_slowdowns(now.reasons) - _slowdowns(was.reasons))
    if slow:
        evidence = {"clock_event_reasons": hex(now.reasons or 0), "slowdown": slow}
        words = f"the GPU is slowed down: {', '.join(slow)}"
        found.append(Finding(GpuSignal.SLOWDOWN, FailureCategory.STRAGGLER, words, evidence))
    return found


class ReportSink(Protocol):
    """Where reports go: the agent's outbox (``unicron.services.agent.outbox``)."""

    def report(self, report: GpuHealthReport) -> None: ...


class GpuHealthWatch:
    """The node's GPUs through the NVML ``load`` gives, reported to ``sink`` as node
    ``node_id`` in the agent's boot ``boot_id``, the counters read every ``interval_s``."""

    def __init__(
        self,
        node_id: str,
        boot_id: str,
        sink: ReportSink,
        interval_s: float,
        load: NvmlLoader = import_pynvml,
        wait_ms: int = EVENT_WAIT_MS,
    ) -> None:
        self.node_id = node_id
        self.boot_id = boot_id
        self.sink = sink
        self.interval_s = interval_s
        self.load = load
        self.wait_ms = wait_ms
        self.log = get_logger(component="gpu-health", node_id=node_id)
        self._last: dict[int, GpuReading] = {}
        self._stop = threading.Event()
        self._warned: set[str] = set()  # errors already logged: a failing query fails each look

    async def run(self) -> None:
        """Watch until cancelled. On a node with nothing to watch, say why once and return."""
        if self.interval_s <= 0:
            self.log.info("GPU health watch off", why="UNICRON_GPU_HEALTH_S is 0")
            return
        try:
            session = await asyncio.to_thread(open_session, self.load)
        except NvmlUnavailableError as exc:
            self.log.info("GPU health watch not started", why=str(exc))
            return
        self.log.info(
            "GPU health watch started", gpus=[g.uuid for g in session.gpus],
            interval_s=self.interval_s, events_unwatched=session.unwatched or None,
        )  # fmt: skip
        self._stop.clear()
        thread = self._start_events(session)
        try:
            await self._poll(session)
        finally:
            self._stop.set()
            await asyncio.to_thread(self._close, session, thread)

    async def _poll(self, session: Session) -> None:
        while True:
            try:
                looks = await asyncio.to_thread(_look, session)
            except Exception as exc:  # a binding's surprise must not end the watch
                self._warn_once(f"look: {exc!r}")
                looks = []
            for gpu, reading in looks:
                for finding in changes(self._last.get(gpu.index), reading):
                    self._send(gpu, finding)
                self._last[gpu.index] = reading
                for error in reading.errors:
                    self._warn_once(f"GPU {gpu.index} {error}")
            await asyncio.sleep(self.interval_s)

    def _start_events(self, session: Session) -> threading.Thread | None:
        if session.events is None:
            return None
        loop = asyncio.get_running_loop()
        thread = threading.Thread(
            target=self._wait_events, args=(session, loop), name="gpu-events", daemon=True
        )
        thread.start()
        return thread

    def _wait_events(self, session: Session, loop: asyncio.AbstractEventLoop) -> None:
        """The event thread: waits in NVML, hands what it finds to the loop."""
        lost = False  # a wait that finds a GPU gone finds it again at once: report it once
        while not self._stop.is_set():
            try:
                seen = wait_event(session, self.wait_ms)
            except Exception as exc:
                self._warn_once(f"event wait: {exc}")
                self._stop.wait(self.wait_ms / 1000)  # the same error again at once: no spin
                continue
            from_error = (
                seen is not None and seen.gpu is None and seen.type == EVENT_GPU_UNAVAILABLE
            )
            if from_error and lost:
                self._stop.wait(self.wait_ms / 1000)
                continue
            lost = from_error
            if seen is not None:
                self._hand_over(loop, seen)

    def _hand_over(self, loop: asyncio.AbstractEventLoop, seen: EventSeen) -> None:
        finding = event_finding(seen)
        if finding is None:
            gpu = None if seen.gpu is None else seen.gpu.index
            self.log.warning("GPU event not reported", gpu=gpu, type=seen.type, data=seen.data)
            return
        try:
            loop.call_soon_threadsafe(self._send, seen.gpu, finding)
        except RuntimeError:  # the loop closed while this thread waited: the agent is gone
            self._stop.set()

    def _send(self, gpu: Gpu | None, finding: Finding) -> None:
        report = GpuHealthReport(
            node_id=self.node_id,
            boot_id=self.boot_id,
            gpu=None if gpu is None else gpu.index,
            uuid=None if gpu is None else gpu.uuid,
            signal=finding.signal,
            category=finding.category,
            message=finding.message,
            evidence=finding.evidence,
        )
        self.log.warning(
            "GPU fault seen", gpu=report.gpu, uuid=report.uuid, signal=report.signal.value,
            category=report.category.value, severity=report.severity.value,
            message=report.message, evidence=report.evidence,
        )  # fmt: skip
        self.sink.report(report)

    def _warn_once(self, error: str) -> None:
        if error not in self._warned:
            self._warned.add(error)
            self.log.warning("GPU health query failed", error=error)

    def _close(self, session: Session, thread: threading.Thread | None) -> None:
        if thread is not None:
            thread.join(timeout=2 * self.wait_ms / 1000 + 1.0)
            if thread.is_alive():  # freeing the set under a wait that hangs could crash NVML
                self.log.warning("GPU event wait did not return; NVML left open")
                return
        try:
            session.close()
        except Exception as exc:
            self.log.warning("NVML did not shut down cleanly", error=str(exc))


def _look(session: Session) -> list[tuple[Gpu, GpuReading]]:
    return [(gpu, read_gpu(session.nvml, gpu)) for gpu in session.gpus]
