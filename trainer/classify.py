"""Exception classifier: name the failure category of an exception from its type and text.

The worker runtime runs this on any exception that escapes a step, before the process dies,
so the control plane learns *why* a rank failed in seconds rather than from an exit code.
It is a table of regular expressions tried in order; the first match wins, so specific
patterns (ECC, out of memory, illegal access) sit above the generic ones they contain
(CUDA error, NCCL error). Text matched is ``"<Type>: <message>"`` for the exception and each
exception it was raised from, because torch often wraps the telling error in a generic one.
"""

from __future__ import annotations

import re

from shared.taxonomy import FailureCategory as C

_I = re.IGNORECASE

RULES: list[tuple[C, re.Pattern[str]]] = [
    (C.NAN_LOSS, re.compile(r"NonFiniteLossError|non-finite loss|loss is (nan|inf)", _I)),
    (
        C.OOM,
        re.compile(
            r"out of memory|OutOfMemoryError|DefaultCPUAllocator: can't allocate memory"
            r"|^MemoryError\b|CUBLAS_STATUS_ALLOC_FAILED",
            _I | re.MULTILINE,
        ),
    ),
    (C.ECC, re.compile(r"\bECC\b|uncorrectable|ecc error", _I)),
    (C.ILLEGAL_MEMORY, re.compile(r"illegal memory access|illegal address", _I)),
    (C.INVALID_DMA, re.compile(r"invalid dma|dma mapping|IOMMU", _I)),
    (C.NVLINK, re.compile(r"nvlink", _I)),
    (
        C.GPU_DRIVER,
        re.compile(
            r"NVIDIA driver|driver version is insufficient|fallen off the bus"
            r"|CUDA driver|cudaErrorNoDevice|no CUDA-capable device",
            _I,
        ),
    ),
    (
        C.NCCL_TIMEOUT,
        re.compile(
            r"Watchdog caught collective operation timeout|collective operation timeout"
            # gloo's tcp pair reports a collective that never completes this way.
            r"|Timed out waiting \d+ ?ms for (recv|send) operation"
            r"|ProcessGroupNCCL.*timed? ?out|NCCL.*timeout",
            _I,
        ),
    ),
    (C.NCCL_ERROR, re.compile(r"\bNCCL\b|nccl[A-Z]\w*Error|ProcessGroupNCCL", _I)),
    (C.CONNECTION_REFUSED, re.compile(r"Connection refused|ECONNREFUSED", _I)),
    (
        C.CONNECTION_RESET,
        re.compile(
            # A peer that closed its end mid-collective shows as a reset on a read and as a
            # broken pipe on a write; either way the link to a live-looking peer is gone.
            r"Connection reset by peer|ECONNRESET|Connection closed by peer|Broken pipe|EPIPE"
            r"|gloo.*Read error|pair\.cc:\d+\] Read error",
            _I,
        ),
    ),
    (C.LINK_FLAPPING, re.compile(r"link (is )?(down|flap)|IBV_EVENT_PORT_ERR|port state", _I)),
    (
        C.NETWORK_OTHER,
        re.compile(
            r"Network is unreachable|No route to host|Connection timed out"
            r"|NET/(IB|Socket)|Write error|gloo.*(transport|pair)",
            _I,
        ),
    ),
    (
        C.CUDA_ERROR,
        re.compile(r"CUDA error|\bCUDA\b.*(failure|failed)|cudaError|CUBLAS_STATUS", _I),
    ),
]


def classify_text(exc_type: str, message: str) -> C:
    """Category of a failure described by an exception type name and its message."""
    text = f"{exc_type}: {message}"
    for category, pattern in RULES:
        if pattern.search(text):
            return category
    return C.SOFTWARE_OTHER


def classify(exc: BaseException) -> C:
    """Category of ``exc``, looking through the chain of exceptions it was raised from."""
    return classify_text(type(exc).__name__, describe_chain(exc))


def describe_chain(exc: BaseException, limit: int = 8) -> str:
    """``"Type: message"`` of ``exc`` and its causes, one per line (the first line bare)."""
    parts = [str(exc)]
    seen = {id(exc)}
    current = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen and len(parts) < limit:
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return "\n".join(parts)
