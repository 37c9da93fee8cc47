"""Exception classifier: name the failure category of an exception from its type and text.

The worker runtime runs this on any exception that escapes a step, before the process dies,
so the control plane learns *why* a rank failed in seconds rather than from an exit code.
Text matched is ``"<Type>: <message>"`` for the exception and each exception it was raised
from, because torch often wraps the telling error in a generic one.

The rules are tried in order and the first match wins. The order encodes one principle: the
most specific *cause* beats the wrapper that carries it. NCCL and torch wrap lower-level
errors ("NCCL error in: …, unhandled cuda error … Last error: Cuda failure 'an illegal memory
access was encountered'"), so GPU hardware comes first, then memory, then the collective
timeout (a watchdog report names ALLREDUCE and peers, but is a timeout, not a network fault)
after the ranks' disagreeing on a collective (gloo reports that from its transport), then the
network causes, then generic CUDA, and only then "some NCCL error".

Where the texts come from (the patterns match these formats; see the tests for full strings):

- torch ``c10d/ProcessGroupNCCL.cpp``: the watchdog's ``checkTimeout`` ("Watchdog caught
  collective operation timeout: WorkNCCL(SeqNum=…, OpType=ALLREDUCE, …) ran for N
  milliseconds before timing out") and ``WorkNCCL::synchronize`` ("… timed out in blocking
  wait"); ``c10d/NCCLUtils.hpp`` ``C10D_NCCL_CHECK`` + ``getNcclErrorDetailStr`` ("NCCL error
  in: <file>:<line>, <ncclGetErrorString>, NCCL version …" then "ncclRemoteError: …",
  "Last error:" and NCCL's last WARN line).
- NCCL ``src/init.cc`` ``ncclGetErrorString`` ("unhandled system error", "remote process
  exited or there was a network error"); ``src/transport/net_ib`` (``p2p.cc``, older
  ``net_ib.cc``): "NET/IB : Got completion from peer … with error 12" / "status=
  IBV_WC_RETRY_EXC_ERR(12)"; ``net_ib/common.cc`` ``ncclIbAsyncThreadMain``: "NET/IB :
  mlx5_0:1 Got async event : port error" (≤ 2.18) or "Got non-fatal async event: port
  error(10)", with libibverbs ``ibv_event_type_str`` names; ``src/misc/socket.cc``
  ``socketProgress``: "Connection closed by remote peer"; ``include/checks.h`` ``CUDACHECK``:
  "Cuda failure '<cudaGetErrorString>'".
- CUDA runtime ``cudaGetErrorString`` as torch raises it (``c10/cuda/CUDAException.cpp``
  ``c10_cuda_check_implementation``: "CUDA error: <string>"): cudaErrorIllegalAddress,
  cudaErrorECCUncorrectable, cudaErrorNvlinkUncorrectable, cudaErrorLaunchFailure,
  cudaErrorInvalidDevice, cudaErrorInsufficientDriver, cudaErrorUnknown, cudaErrorNoDevice.
- NVIDIA kernel driver (dmesg): "NVRM: Xid (PCI:0000:3b:00): 79, pid=…, GPU has fallen off
  the bus." Xid 48/63/64/92/94/95 are ECC, 74 NVLink, 79 and 119/120 (GSP) driver/bus, 31 an
  MMU fault (what an illegal address is to the driver). Linux IOMMU: intel-iommu "DMAR: [DMA
  Read NO_PASID] Request device [..] fault addr …", amd_iommu "AMD-Vi: Event logged
  [IO_PAGE_FAULT …]".
- torch ``c10/cuda/CUDACachingAllocator.cpp`` "CUDA out of memory. Tried to allocate …"
  (raised as ``torch.OutOfMemoryError``); ``c10/core/impl/alloc_cpu.cpp`` "DefaultCPUAllocator:
  can't allocate memory: you tried to allocate N bytes. Error code 12 (…)".
- gloo ``transport/tcp/pair.cc`` (``Pair::read``, ``handleReadWrite``): "[…/pair.cc:N]
  Connection closed by peer [ip]:port", "Read error [ip]:port: <strerror>", "Read timeout",
  "Write timeout"; ``transport/tcp/unbound_buffer.cc`` ``waitRecv``/``waitSend``: "Timed out
  waiting Nms for recv operation to complete" — gloo's collective timeout, the CPU
  counterpart of the NCCL watchdog's, so it is ``nccl_timeout``; ``transport/tcp/socket.cc``
  "connect: Connection refused".
- A collective mismatch: gloo ``transport/tcp/pair.cc`` enforces "op.preamble.length <=
  op.nbytes. 2112 vs 4. Received data size doesn't match expected size. Is there a distributed
  collective mismatch in your code?" (a ``gloo::EnforceNotMet`` thrown on gloo's own thread:
  the process aborts, see :mod:`unicron.services.agent.tracebacks`); torch
  ``c10d/ProcessGroupWrapper.cpp`` (with ``TORCH_DISTRIBUTED_DEBUG=DETAIL``): "Detected
  mismatch between collectives on ranks. Rank 0 is running collective:
  CollectiveFingerPrint(…), but Rank 1 is running …"; NCCL
  ``ncclGetErrorString(ncclInvalidUsage)``: "invalid usage (run with NCCL_DEBUG=WARN for
  details)", then "ncclInvalidUsage: This usually reflects invalid usage of NCCL library."
- torch ``c10d/socket.cpp`` ``SocketConnectOp``: "The client socket has timed out after Nms
  while trying to connect to (host, port).", "… has failed to connect to any network address
  of (…)"; ``c10d/Utils.hpp`` ``SYSCHECK``/``recvBytes``: "Socket Timeout", "Failed to recv,
  got 0 bytes. Connection was likely closed."; ``c10d/TCPStore.cpp``: "wait timeout after Nms,
  keys: …", "Timed out after N seconds waiting for clients" (``DistStoreError``).
"""

from __future__ import annotations

import re

from unicron.shared.contracts.taxonomy import FailureCategory as C


def _any(*patterns: str, flags: int = re.IGNORECASE) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in patterns), flags)


# "NVRM: Xid (PCI:0000:3b:00): 79, …" — the number after the device is the Xid code.
_XID = r"\bXid\b \([^)]*\): "

RULES: list[tuple[C, re.Pattern[str]]] = [
    # Our own guard (trainer/parallel.py) and torch's anomaly mode ("… returned nan values").
    (C.NAN_LOSS, _any(r"NonFiniteLossError", r"non-finite loss", r"returned nan values")),
    # --- GPU hardware: when any wrapper carries one of these, it is the cause.
    (C.ECC, _any(r"\bECC\b", r"double bit error|\bDBE\b", _XID + r"(48|63|64|92|94|95)\b")),
    # "NVLink SHARP (NVLS)" errors in NCCL are resource set-up failures, not a broken link.
    (C.NVLINK, _any(r"nvlink(?! SHARP)", _XID + r"74\b")),
    (
        C.INVALID_DMA,
        _any(r"invalid DMA", r"DMA[- ]?mapping", r"\bIOMMU\b", r"DMAR: .*fault", r"IO_PAGE_FAULT"),
    ),
    (
        C.GPU_DRIVER,
        _any(
            r"driver version is insufficient",  # cudaErrorInsufficientDriver
            r"no NVIDIA driver|NVIDIA driver on your system is too old",  # torch _check_driver
            r"fallen off the bus",
            _XID + r"(79|119|120)\b",
            r"unsupported display driver / cuda driver combination",  # SystemDriverMismatch
            r"CUDA driver is a stub library",
            r"no CUDA-capable device is detected",  # cudaErrorNoDevice
            # cudaErrorUnknown: in training it follows a driver or GPU that went bad
            r"CUDA error: unknown error|cudaErrorUnknown|CUDA_ERROR_UNKNOWN",
        ),
    ),
    (
        C.ILLEGAL_MEMORY,
        _any(r"illegal memory access", r"illegal address", r"MMU Fault", _XID + r"31\b"),
    ),
    (
        C.OOM,
        _any(
            r"out of memory",  # allocator, cudaErrorMemoryAllocation, NCCL's Cuda failure
            r"OutOfMemoryError",
            r"DefaultCPUAllocator: can't allocate memory",
            r"^MemoryError\b",
            r"CUBLAS_STATUS_ALLOC_FAILED",
            flags=re.IGNORECASE | re.MULTILINE,
        ),
    ),
    # --- the ranks disagree on a collective: the job's own fault, though it surfaces in the
    # transport (gloo's enforce names pair.cc) or as NCCL's error.
    (
        C.COLLECTIVE_MISMATCH,
        _any(
            r"collective mismatch",  # gloo: "Is there a distributed collective mismatch …"
            r"Received data size doesn't match expected size",
            r"Detected mismatch between collectives",  # TORCH_DISTRIBUTED_DEBUG=DETAIL
            r"\bncclInvalidUsage\b",
            r"invalid usage \(run with NCCL_DEBUG",  # ncclGetErrorString(ncclInvalidUsage)
        ),
    ),
    # --- the collective timed out: it names the op and peers, but the timeout is the fact.
    (
        C.NCCL_TIMEOUT,
        _any(
            r"Watchdog caught collective operation timeout",
            r"ran for \d+ milliseconds before timing out",
            r"timed out in blocking wait",
            r"Timed out waiting \d+ ?ms for (recv|send) operation to complete",  # gloo
        ),
    ),
    # --- network causes, most specific first.
    (
        C.LINK_FLAPPING,
        _any(
            r"async event ?: port (error|active)",
            r"IBV_EVENT_PORT_(ERR|ACTIVE)",
            r"port( \S+)? state changed to (DOWN|ACTIVE|INIT|ARMED|UP)\b",  # UFM, switch logs
            r"link state changed to (down|up)",
            r"\blink (is )?(down|flapp?ing)\b",
            # IBV_WC_RETRY_EXC_ERR: the peer's HCA stopped acknowledging, what a link that
            # drops mid-transfer produces (verbs: "transport retry counter exceeded").
            r"Got completion[^\n]*(error 12\b|status=12\b|IBV_WC_RETRY_EXC_ERR)",
            r"retry count(er)? exceeded",
        ),
    ),
    (C.CONNECTION_REFUSED, _any(r"Connection refused", r"ECONNREFUSED")),
    (
        C.CONNECTION_RESET,
        _any(
            # A peer that went away mid-collective: reset on a read, broken pipe on a write,
            # a clean close when its process exited.
            r"Connection reset by peer|ECONNRESET",
            r"Connection closed by (remote )?peer",
            r"Broken pipe|EPIPE",
            r"Connection was likely closed|Remote peer closed the connection",
            r"Socket (unexpectedly )?closed",
            # NCCL's ncclRemoteError, whatever its last error line says; and the next
            # collective after the communicator was aborted because a peer is gone
            # (trainer/comm.py), as captured on an H200 (tests/trainer/data/).
            r"remote process exit(ed|ing)",
            r"NCCL communicator was aborted",
        ),
    ),
    (
        C.NETWORK_OTHER,
        _any(
            r"NET/(IB|Socket)\b",
            r"async fatal event",
            r"Network is unreachable|No route to host|Connection timed out",
            r"Socket Timeout",
            r"(Read|Write) (error|timeout) \[",  # gloo pair
            r"gloo/transport/",
            r"The client socket has (timed out|failed to connect)",
            r"wait timeout after \d+ ?ms|waiting for clients|Timeout waiting for key",
            r"DistStoreError|DistNetworkError|\bTCPStore\b",
        ),
    ),
    (
        C.CUDA_ERROR,
        _any(
            r"CUDA error",
            r"cudaError\w+|Cuda failure",
            r"CUBLAS_STATUS|CUDNN_STATUS",
            r"unspecified launch failure",
            r"device-side assert",
            r"invalid device ordinal",
            r"\bCUDA\b[^\n]*\b(failure|failed)\b",
        ),
    ),
    # --- an NCCL error that carried no more specific cause.
    (C.NCCL_ERROR, re.compile(r"(?i:\bNCCL\b|ProcessGroupNCCL)|nccl[A-Z]\w*Error")),
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
