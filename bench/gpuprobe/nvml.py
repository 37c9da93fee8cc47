"""NVML, scenario 8: each NVML call this design might use (health counters, Xid events, the
recovery action field, NVLink state), timed, answered or not (the ``nvml`` role)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import time
from typing import TYPE_CHECKING, Any

from bench.gpuprobe.common import Record, describe, emit, exit_now, finish

if TYPE_CHECKING:
    from bench.gpuprobe.probe import Probe

_DEVICE_QUERIES = (
    ("name", "nvmlDeviceGetName"),
    ("uuid", "nvmlDeviceGetUUID"),
    ("pci_info", "nvmlDeviceGetPciInfo"),
    ("virtualization_mode", "nvmlDeviceGetVirtualizationMode"),
    ("persistence_mode", "nvmlDeviceGetPersistenceMode"),
    ("compute_mode", "nvmlDeviceGetComputeMode"),
    ("mig_mode", "nvmlDeviceGetMigMode"),
    ("ecc_mode", "nvmlDeviceGetEccMode"),
    ("performance_state", "nvmlDeviceGetPerformanceState"),
    ("memory", "nvmlDeviceGetMemoryInfo"),
    ("utilization", "nvmlDeviceGetUtilizationRates"),
    ("power_mw", "nvmlDeviceGetPowerUsage"),
    ("power_limit_mw", "nvmlDeviceGetEnforcedPowerLimit"),
    ("energy_mj", "nvmlDeviceGetTotalEnergyConsumption"),
    ("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus"),
    ("remapped_rows", "nvmlDeviceGetRemappedRows"),
    ("row_remapper_histogram", "nvmlDeviceGetRowRemapperHistogram"),
    ("compute_processes", "nvmlDeviceGetComputeRunningProcesses"),
    ("supported_event_types", "nvmlDeviceGetSupportedEventTypes"),
)
# Queries that take pynvml constants (by name) after the handle.
_CONST_QUERIES = (
    ("temperature_c", "nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",)),
    ("sm_clock_mhz", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",)),
    *(
        (
            f"ecc_{error_type.lower()}_{counter.lower()}",
            "nvmlDeviceGetTotalEccErrors",
            (f"NVML_MEMORY_ERROR_TYPE_{error_type}", f"NVML_{counter}_ECC"),
        )
        for error_type in ("CORRECTED", "UNCORRECTED")
        for counter in ("VOLATILE", "AGGREGATE")
    ),
    *(
        (
            f"retired_pages_{cause.lower()}",
            "nvmlDeviceGetRetiredPages",
            (f"NVML_PAGE_RETIREMENT_CAUSE_{cause}",),
        )
        for cause in ("MULTIPLE_SINGLE_BIT_ECC_ERRORS", "DOUBLE_BIT_ECC_ERROR")
    ),
)
_FIELDS = (
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
    "NVML_FI_DEV_RETIRED_PENDING",
    "NVML_FI_DEV_REMAPPED_UNC",
    "NVML_FI_DEV_REMAPPED_PENDING",
    "NVML_FI_DEV_REMAPPED_FAILURE",
    "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    "NVML_FI_DEV_NVLINK_LINK_COUNT",
)
_FIELD_KINDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _jsonable(value: Any, depth: int = 0) -> Any:
    """pynvml's answers (ctypes structures, unions, arrays, bytes) as JSON values."""
    if depth > 4:
        return repr(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(item, depth + 1) for item in value]
    if isinstance(value, ctypes.Array):
        return [_jsonable(item, depth + 1) for item in value]
    fields = getattr(value, "_fields_", None)
    if fields is not None:
        return {f[0]: _jsonable(getattr(value, f[0]), depth + 1) for f in fields}
    return repr(value)


class Calls:
    """The record of NVML calls: each one's label, function, status, answer and time."""

    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.records: list[Record] = []

    def missing(self, label: str, name: str) -> Record | None:
        """Record ``name`` as missing in pynvml, if it is; its record, else None."""
        if getattr(self.nv, name, None) is not None:
            return None
        record: Record = {"call": label, "fn": name, "status": "missing in pynvml"}
        self.records.append(record)
        return record

    def call(self, label: str, name: str, *args: Any) -> Any:
        """Call pynvml's ``name``; its answer, or None if it is missing or raised."""
        if self.missing(label, name) is not None:
            return None
        record: Record = {"call": label, "fn": name}
        start = time.perf_counter()
        try:
            value = getattr(self.nv, name)(*args)
            record.update(status="ok", value=_jsonable(value))
        except Exception as exc:
            value = None
            record.update(status="error", error=type(exc).__name__, text=str(exc))
        record["ms"] = round((time.perf_counter() - start) * 1000, 3)
        self.records.append(record)
        return value

    def const(self, name: str) -> Any:
        """A pynvml constant, None where this pynvml lacks it."""
        return getattr(self.nv, name, None)


def role_nvml(cfg: Record) -> None:
    """Each NVML call this design might use, timed; an NVMLError is recorded by its text."""
    emit("started")
    try:
        nv = importlib.import_module("pynvml")
    except ImportError as exc:
        emit("nvml_missing", exc=describe(exc))
        exit_now(0)
    calls = Calls(nv)
    calls.call("init", "nvmlInit")
    calls.call("driver_version", "nvmlSystemGetDriverVersion")
    calls.call("nvml_version", "nvmlSystemGetNVMLVersion")
    calls.call("cuda_driver_version", "nvmlSystemGetCudaDriverVersion_v2")
    count = calls.call("device_count", "nvmlDeviceGetCount")
    handle = calls.call("handle", "nvmlDeviceGetHandleByIndex", 0) if count else None
    if handle is not None:
        _device(calls, handle)
        _events(calls, handle)
        _nvlink(calls, handle)
        _fields(calls, handle)
    calls.call("shutdown", "nvmlShutdown")
    emit("nvml", pynvml_file=getattr(nv, "__file__", None), calls=calls.records)
    finish()


def _device(calls: Calls, handle: Any) -> None:
    """The device's identity, state, health counters and clock-event reasons."""
    for label, name in _DEVICE_QUERIES:
        calls.call(label, name, handle)
    for label, name, constants in _CONST_QUERIES:
        calls.call(label, name, handle, *(calls.const(c) for c in constants))
    name = "nvmlDeviceGetCurrentClocksEventReasons"
    if calls.const(name) is None:
        name = "nvmlDeviceGetCurrentClocksThrottleReasons"
    mask = calls.call("clock_event_reasons", name, handle)
    if isinstance(mask, int):
        calls.records[-1]["decoded"] = _decode_bits(calls.nv, mask, ("nvmlClocksEventReason",))
    for record in calls.records:
        if record["call"] == "supported_event_types" and isinstance(record.get("value"), int):
            record["decoded"] = _decode_bits(calls.nv, record["value"], ("nvmlEventType",))


def _decode_bits(nv: Any, mask: int, prefixes: tuple[str, ...]) -> list[str]:
    """The names of pynvml's one-bit constants (with these prefixes) set in ``mask``."""
    names: dict[int, str] = {}
    for name in sorted(dir(nv)):
        bit = getattr(nv, name)
        if not name.startswith(prefixes) or not isinstance(bit, int) or isinstance(bit, bool):
            continue
        if bit > 0 and bit & (bit - 1) == 0 and mask & bit:
            names.setdefault(bit, name)
    return [names[bit] for bit in sorted(names)]


def _events(calls: Calls, handle: Any) -> None:
    """Whether waiting for Xid events works here."""
    event_set = calls.call("event_set_create", "nvmlEventSetCreate")
    if event_set is None:
        return
    xid = calls.const("nvmlEventTypeXidCriticalError")
    calls.call("register_xid_events", "nvmlDeviceRegisterEvents", handle, xid, event_set)
    # Expected: NVMLError_Timeout after 100 ms, the sign that waiting for an Xid works here.
    calls.call("event_wait_100ms", "nvmlEventSetWait_v2", event_set, 100)
    calls.call("event_set_free", "nvmlEventSetFree", event_set)


def _nvlink(calls: Calls, handle: Any) -> None:
    """Each NVLink's state, until the same error comes twice (no more links)."""
    if calls.missing("nvlink_state", "nvmlDeviceGetNvLinkState") is not None:
        return
    fn = calls.nv.nvmlDeviceGetNvLinkState
    links: list[Any] = []
    start = time.perf_counter()
    for link in range(int(getattr(calls.nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            links.append(int(fn(handle, link)))
        except Exception as exc:
            links.append(f"{type(exc).__name__}: {exc}")
            if link >= 1 and links[0] == links[-1]:  # the same error twice: no more links
                break
    status = "ok" if any(isinstance(link, int) for link in links) else "error"
    ms = round((time.perf_counter() - start) * 1000, 3)
    record = {"call": "nvlink_state", "fn": "nvmlDeviceGetNvLinkState"}
    calls.records.append({**record, "status": status, "value": links, "ms": ms})


def _fields(calls: Calls, handle: Any) -> None:
    """The field values (the GPU recovery action, pending retirements and remaps, ...)."""
    for field in _FIELDS:
        fid = calls.const(field)
        if fid is None:
            calls.records.append({"call": field, "status": "constant missing in pynvml"})
            continue
        values = calls.call(field, "nvmlDeviceGetFieldValues", handle, [fid])
        if values is not None:
            value = _field_value(calls.nv, values[0])
            calls.records[-1]["value"] = value
            if value["nvmlReturn"] != 0:  # the call answered, the field did not
                calls.records[-1].update(status="error", text=value.get("error"))


def _field_value(nv: Any, value: Any) -> Record:
    """One field value's return code and value (by its type), or its error's text."""
    ret = int(value.nvmlReturn)
    record: Record = {"fieldId": int(value.fieldId), "nvmlReturn": ret}
    if ret != 0:
        with contextlib.suppress(Exception):
            record["error"] = str(nv.NVMLError(ret))
        return record
    kind = _FIELD_KINDS.get(int(value.valueType), "ullVal")
    record["value"] = getattr(value.value, kind)
    record["valueType"] = kind
    return record


def s8_nvml(probe: Probe) -> Record:
    """Scenario 8: which NVML calls answer here."""
    child = probe.solo("s8_nvml", "nvml", 60)
    found = child.event("nvml")
    if found is None:
        missing = child.event("nvml_missing")
        return {"outcome": "pynvml missing" if missing else "failed", "missing": missing}
    calls: list[Record] = found["calls"]
    ok = [c["call"] for c in calls if c.get("status") == "ok"]
    bad = [c["call"] for c in calls if c.get("status") != "ok"]
    return {
        "outcome": f"{len(ok)} calls ok, {len(bad)} not",
        "key": f"not ok: {', '.join(bad)}"[:200],
        "calls": calls,
    }
