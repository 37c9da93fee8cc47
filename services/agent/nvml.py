"""NVML as the GPU health watch uses it: the calls it makes, what one look at a GPU reads, and
where the module comes from.

NVML's Python binding (nvidia-ml-py, module ``pynvml``) is optional, the ``gpu`` extra: a node
without it, without the driver's library or without a GPU runs the agent all the same, and
:func:`open_session` says why there is nothing to watch. The watch is handed a loader rather
than importing the module, so the tests drive this same code with a stand-in fed from what a
real H200 answered (``tests/agent/fakenvml.py``, docs/gpu-probe.md §8). Every call here blocks
(an event wait for up to its timeout): the watch makes them in threads, never on the event loop.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, cast

T = TypeVar("T")
# Values of nvml.h, stable across drivers: a stand-in then need not carry the binding's names.
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8
EVENT_GPU_UNAVAILABLE = 0x4000
WATCHED_EVENTS = EVENT_DOUBLE_BIT_ECC | EVENT_XID | EVENT_GPU_UNAVAILABLE
ERROR_NOT_SUPPORTED = 3
ERROR_TIMEOUT = 10
ERROR_GPU_IS_LOST = 15
MEMORY_ERROR_UNCORRECTED = 1
VOLATILE_ECC = 0
FEATURE_ENABLED = 1
# Clock event ("throttle") reasons that make one GPU slower than its peers. An idle GPU, the
# software power cap, application clocks or sync boost are how a healthy GPU runs.
SLOWDOWN_REASONS = {
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


class EventData(Protocol):
    """One event of the set, as the binding's structure names its fields."""

    device: object
    eventType: int
    eventData: int


class Nvml(Protocol):
    """The part of ``pynvml`` the watch calls, by the binding's names."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...
    def nvmlDeviceGetUUID(self, handle: object, /) -> str | bytes: ...
    def nvmlDeviceGetSupportedEventTypes(self, handle: object, /) -> int: ...
    def nvmlEventSetCreate(self) -> object: ...
    def nvmlDeviceRegisterEvents(self, handle: object, types: int, events: object, /) -> None: ...
    def nvmlEventSetWait_v2(self, events: object, timeout_ms: int, /) -> EventData: ...
    def nvmlEventSetFree(self, events: object, /) -> None: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: object, kind: int, counter: int, /) -> int: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: object, /) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: object, /) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object, /) -> int: ...


NvmlLoader = Callable[[], Nvml]


class NvmlUnavailableError(Exception):
    """There is no NVML to watch the node's GPUs with; the message says why."""


def import_pynvml() -> Nvml:
    """The real binding; ``NvmlUnavailableError`` when it is not installed."""
    try:
        module = importlib.import_module("pynvml")
    except ImportError as exc:
        why = "nvidia-ml-py is not installed (pip install 'unicron[gpu]')"
        raise NvmlUnavailableError(why) from exc
    return cast(Nvml, module)


def error_code(exc: BaseException) -> int | None:
    """NVML's return code behind a binding's error (``NVMLError.value``)."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class Gpu:
    """One GPU by NVML's index; a GPU already lost when the watch starts has no UUID or handle
    (its first look reports it lost)."""

    index: int
    uuid: str | None
    handle: object | None


@dataclass(frozen=True)
class EventSeen:
    """One event of the set: the GPU it names (None when NVML could not say), its type and
    data (the Xid, for an Xid event)."""

    gpu: Gpu | None
    type: int
    data: int


@dataclass(frozen=True)
class GpuReading:
    """One look at a GPU's counters; None where NVML does not support the query."""

    lost: bool = False
    ecc_uncorrected: int | None = None  # volatile: since the driver loaded or the GPU reset
    retirement_pending: bool | None = None
    remapped: tuple[int, int, bool, bool] | None = None  # corrected, uncorrected, pending, failed
    reasons: int | None = None  # clock event reasons, a bit mask
    errors: tuple[str, ...] = ()  # queries that failed for another reason than "not supported"


@dataclass
class Session:
    """NVML initialised, the node's GPUs, and the event set they are registered in (None when
    no GPU supports the watched events: the counters are still read)."""

    nvml: Nvml
    gpus: list[Gpu]
    events: object | None = None
    unwatched: dict[int, str] = field(default_factory=dict)  # GPU → why no events from it

    def close(self) -> None:
        try:
            if self.events is not None:
                self.nvml.nvmlEventSetFree(self.events)
        finally:
            self.nvml.nvmlShutdown()


def open_session(load: NvmlLoader) -> Session:
    """NVML started, the GPUs listed and registered for events; ``NvmlUnavailableError`` says
    why not (no binding, no driver, no GPU)."""
    nvml = load()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailableError(f"NVML did not start: {exc} (no NVIDIA driver here?)") from exc
    try:
        session = Session(nvml, _gpus(nvml))
        if not session.gpus:
            raise NvmlUnavailableError("NVML sees no GPU on this node")
        _register(session)
    except BaseException as exc:
        nvml.nvmlShutdown()
        if isinstance(exc, nvml.NVMLError):
            raise NvmlUnavailableError(f"NVML cannot list the GPUs: {exc}") from exc
        raise
    return session


def _gpus(nvml: Nvml) -> list[Gpu]:
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle: object | None = None
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(Gpu(index, _text(nvml.nvmlDeviceGetUUID(handle)), handle))
        except nvml.NVMLError as exc:
            if error_code(exc) != ERROR_GPU_IS_LOST:
                raise
            gpus.append(Gpu(index, None, None))  # gone before the agent (re)started
    return gpus


def _register(session: Session) -> None:
    nvml, events = session.nvml, session.nvml.nvmlEventSetCreate()
    for gpu in session.gpus:
        if gpu.handle is None:
            session.unwatched[gpu.index] = "it is lost"
            continue
        try:
            types = nvml.nvmlDeviceGetSupportedEventTypes(gpu.handle) & WATCHED_EVENTS
            if not types:
                session.unwatched[gpu.index] = "it supports none of the watched events"
                continue
            nvml.nvmlDeviceRegisterEvents(gpu.handle, types, events)
        except nvml.NVMLError as exc:
            session.unwatched[gpu.index] = str(exc)
    if len(session.unwatched) < len(session.gpus):
        session.events = events
    else:
        nvml.nvmlEventSetFree(events)


def wait_event(session: Session, timeout_ms: int) -> EventSeen | None:
    """The next event, or None when none came within ``timeout_ms``. A wait that finds a GPU
    gone answers as the "GPU unavailable" event of an unknown GPU; other errors raise."""
    nvml = session.nvml
    try:
        data = nvml.nvmlEventSetWait_v2(session.events, timeout_ms)
    except nvml.NVMLError as exc:
        code = error_code(exc)
        if code == ERROR_TIMEOUT:
            return None
        if code == ERROR_GPU_IS_LOST:
            return EventSeen(None, EVENT_GPU_UNAVAILABLE, 0)
        raise
    try:
        uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
    except nvml.NVMLError:
        uuid = None  # the GPU may be the one that is gone: the event still counts, node-wide
    gpu = None if uuid is None else next((g for g in session.gpus if g.uuid == uuid), None)
    return EventSeen(gpu, int(data.eventType), int(data.eventData))


class _GpuLostError(Exception):
    pass


def read_gpu(nvml: Nvml, gpu: Gpu) -> GpuReading:
    """Every counter the watch compares between looks; a lost GPU ends the look at once."""
    if gpu.handle is None:
        return GpuReading(lost=True)
    errors: list[str] = []

    def ask(name: str, query: Callable[[], T]) -> T | None:
        try:
            return query()
        except nvml.NVMLError as exc:
            code = error_code(exc)
            if code == ERROR_GPU_IS_LOST:
                raise _GpuLostError from exc
            if code != ERROR_NOT_SUPPORTED:
                errors.append(f"{name}: {exc}")
            return None

    handle = gpu.handle
    try:
        ecc = ask("ECC errors", lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC))  # fmt: skip
        pages = ask("retired pages", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        rows = ask("remapped rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
        reasons = ask("clock reasons", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    except _GpuLostError:
        return GpuReading(lost=True)
    return GpuReading(
        ecc_uncorrected=ecc,
        retirement_pending=None if pages is None else pages == FEATURE_ENABLED,
        remapped=None if rows is None else _remapped(rows),
        reasons=reasons,
        errors=tuple(errors),
    )


def _remapped(rows: tuple[int, int, int, int]) -> tuple[int, int, bool, bool]:
    corrected, uncorrected, pending, failed = rows
    return corrected, uncorrected, bool(pending), bool(failed)
