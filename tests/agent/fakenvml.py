"""A recorded NVML stand-in for the CPU tests: the ``pynvml`` functions the GPU health watch
calls (:class:`unicron.services.agent.nvml.Nvml`), answering what a real H200 answered
(``tests/agent/data/nvml_h200.json``, docs/gpu-probe.md §8) until a test changes one answer: a
counter, a lost GPU, an event. Its event wait blocks for its timeout and then raises NVML's
Timeout, as the real one did, so the watch's thread runs the path it runs on a GPU.
:func:`watching` runs the watch on it for a test."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import json
import queue
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unicron.services.agent.gpuhealth import GpuHealthWatch, ReportSink
from unicron.shared.contracts.reports import GpuHealthReport

from tests.agent.conftest import until

BOOT = "boot-n1"  # the agent boot the watch reports as
RECORDED = Path(__file__).parent / "data" / "nvml_h200.json"
# NVML return codes (nvml.h) by the names the recording uses, and the binding's texts
ERRORS = {"Uninitialized": 1, "NotSupported": 3, "DriverNotLoaded": 9, "Timeout": 10,
          "LibraryNotFound": 12, "GPUIsLost": 15, "Unknown": 999}  # fmt: skip
TEXTS = {1: "Uninitialized", 3: "Not Supported", 9: "Driver Not Loaded", 10: "Timeout",
         12: "NVML Shared Library Not Found", 15: "GPU is lost", 999: "Unknown Error"}  # fmt: skip
EVENT_TYPES = {"SingleBitEccError": 0x1, "DoubleBitEccError": 0x2, "PState": 0x4,
               "XidCriticalError": 0x8, "Clock": 0x10, "DramRetirementEvent": 0x400,
               "DramRetirementFailure": 0x800, "GpuUnavailableError": 0x4000,
               "GpuRecoveryAction": 0x8000}  # fmt: skip


class FakeNvmlError(Exception):
    """As ``pynvml.NVMLError``: the return code in ``value``, the binding's text as ``str``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return TEXTS.get(self.value, f"NVML error {self.value}")


@dataclass(eq=False)
class FakeGpu:
    """A device handle: its recorded answers, which a test may change."""

    index: int
    uuid: str
    answers: dict[str, Any]
    lost: bool = False


@dataclass
class FakeEventData:
    """As ``c_nvmlEventData_t``, by its field names."""

    device: FakeGpu | None
    eventType: int
    eventData: int


@dataclass
class FakeNvml:
    devices: list[dict[str, Any]]
    init_error: str | None = None  # e.g. "LibraryNotFound": a node without the driver
    gpus: list[FakeGpu] = field(init=False)
    events: queue.Queue[FakeEventData | int] = field(default_factory=queue.Queue)
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    registered: dict[int, int] = field(default_factory=dict)  # GPU → event types
    initialised: bool = False
    shutdowns: int = 0
    sets_freed: int = 0
    NVMLError = FakeNvmlError

    def __post_init__(self) -> None:
        self.gpus = [FakeGpu(d["index"], d["uuid"], copy.deepcopy(d)) for d in self.devices]

    @classmethod
    def h200(cls, **kwargs: Any) -> FakeNvml:
        """The H200 of docs/gpu-probe.md §8, as recorded."""
        return cls(json.loads(RECORDED.read_text())["devices"], **kwargs)

    @classmethod
    def h200_node(cls, count: int) -> FakeNvml:
        """``count`` of the recorded H200, at NVML indices 0, 1 … with UUIDs of their own."""
        recorded = json.loads(RECORDED.read_text())["devices"][0]
        tail = recorded["uuid"][6:]  # GPU-ffdc4ba6-… → GPU-00dc4ba6-…, GPU-01dc4ba6-…
        return cls([{**recorded, "index": i, "uuid": f"GPU-{i:02x}{tail}"} for i in range(count)])

    @property
    def looks(self) -> int:
        """How many looks at the GPUs the watch has begun (each reads the ECC counts first)."""
        return self.calls["total_ecc_errors"]

    # --- what a test changes --------------------------------------------------------------

    def answer(self, gpu: int, key: str, value: Any) -> None:
        self.gpus[gpu].answers[key] = value

    def event(self, gpu: int | None, kind: str, data: int = 0) -> None:
        device = None if gpu is None else self.gpus[gpu]
        self.events.put(FakeEventData(device, EVENT_TYPES[kind], data))

    def xid(self, gpu: int, xid: int) -> None:
        self.event(gpu, "XidCriticalError", xid)

    def fail_wait(self, error: str) -> None:
        """The next event wait raises ``error`` instead of waiting."""
        self.events.put(ERRORS[error])

    # --- pynvml ----------------------------------------------------------------------------

    def _answer(self, gpu: FakeGpu, key: str) -> Any:
        self.calls[key] += 1
        if not self.initialised:
            raise FakeNvmlError(ERRORS["Uninitialized"])
        if gpu.lost:
            raise FakeNvmlError(ERRORS["GPUIsLost"])
        value = gpu.answers[key]
        if isinstance(value, dict) and "error" in value:
            raise FakeNvmlError(ERRORS[value["error"]])
        return value

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNvmlError(ERRORS[self.init_error])
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu, /) -> str:
        return str(self._answer(handle, "uuid"))

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeGpu, /) -> int:
        names = self._answer(handle, "supported_event_types")
        return sum(EVENT_TYPES[name] for name in names)

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: FakeGpu, types: int, _set: object, /) -> None:
        self.registered[handle.index] = types

    def nvmlEventSetWait_v2(self, _set: object, timeout_ms: int, /) -> FakeEventData:
        try:
            item = self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise FakeNvmlError(ERRORS["Timeout"]) from None
        if isinstance(item, int):
            raise FakeNvmlError(item)
        return item

    def nvmlEventSetFree(self, _set: object, /) -> None:
        self.sets_freed += 1

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, kind: int, counter: int, /) -> int:
        counts = self._answer(handle, "total_ecc_errors")
        return int(counts[("corrected", "uncorrected")[kind]][("volatile", "aggregate")[counter]])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeGpu, /) -> int:
        return int(self._answer(handle, "retired_pages_pending_status"))

    def nvmlDeviceGetRemappedRows(self, handle: FakeGpu, /) -> tuple[int, int, int, int]:
        corrected, uncorrected, pending, failed = self._answer(handle, "remapped_rows")
        return corrected, uncorrected, pending, failed

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu, /) -> int:
        return int(self._answer(handle, "clocks_event_reasons"))


# --- the watch on the stand-in ----------------------------------------------------------


class Reports:
    """Stands in for the outbox: the watch's reports land in a queue."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[GpuHealthReport] = asyncio.Queue()

    def report(self, report: GpuHealthReport) -> None:
        self.queue.put_nowait(report)

    async def next(self, within: float = 5.0) -> GpuHealthReport:
        async with asyncio.timeout(within):
            return await self.queue.get()


async def looks(fake: FakeNvml, more: int = 2) -> None:
    """Wait until the watch began ``more`` further looks: what an earlier one found is sent."""
    target = fake.looks + more
    await until(lambda: fake.looks >= target)


@contextlib.asynccontextmanager
async def watching(fake: FakeNvml, sink: ReportSink | None = None) -> AsyncIterator[Reports]:
    """The watch of node n1 on ``fake``, looking every 20 ms, from its first look until the
    block ends; its reports go to ``sink`` or, by default, to the ``Reports`` it yields."""
    reports = Reports()
    watch = GpuHealthWatch("n1", BOOT, sink or reports, 0.02, load=lambda: fake, wait_ms=20)
    task = asyncio.create_task(watch.run())
    try:
        # a lost GPU's look asks NVML nothing: then the start is all there is to wait for
        lost = any(gpu.lost for gpu in fake.gpus)
        await until(lambda: (fake.initialised and (lost or fake.looks >= 1)) or task.done())
        if task.done():
            raise AssertionError(f"the watch ended before its first look: {task.result()!r}")
        yield reports
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
