"""Exception classification on the texts real failures produce."""

from __future__ import annotations

import pytest

from shared.taxonomy import FailureCategory as C
from trainer.classify import classify, classify_text
from trainer.parallel import NonFiniteLossError

GLOO_PAIR = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534]"

CASES = [
    (
        "RuntimeError",
        f"{GLOO_PAIR} Read error [127.0.0.1]:41235: Connection reset by peer",
        C.CONNECTION_RESET,
    ),
    (
        "RuntimeError",
        f"{GLOO_PAIR} Connection closed by peer [127.0.0.1]:22435. This is "
        "typically caused by a remote worker crashing.",
        C.CONNECTION_RESET,
    ),
    (
        "RuntimeError",
        f"{GLOO_PAIR} Write error [127.0.0.1]:41235: Broken pipe",
        C.CONNECTION_RESET,
    ),
    (
        "DistNetworkError",
        "The client socket has failed to connect to any network address of "
        "(127.0.0.1, 29500). connect() to 127.0.0.1:29500 failed: Connection refused",
        C.CONNECTION_REFUSED,
    ),
    (
        "RuntimeError",
        f"{GLOO_PAIR} Timed out waiting 1800000ms for recv operation to complete",
        C.NCCL_TIMEOUT,
    ),
    (
        "OutOfMemoryError",
        "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB "
        "total capacity; 75.02 GiB already allocated)",
        C.OOM,
    ),
    (
        "RuntimeError",
        "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't "
        "allocate memory: you tried to allocate 1099511627776 bytes. Error code 12",
        C.OOM,
    ),
    (
        "DistBackendError",
        "[Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
        "for 600013 milliseconds before timing out.",
        C.NCCL_TIMEOUT,
    ),
    (
        "DistBackendError",
        "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error "
        "(run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3",
        C.NCCL_ERROR,
    ),
    (
        "RuntimeError",
        "CUDA error: an illegal memory access was encountered\nCUDA kernel "
        "errors might be asynchronously reported",
        C.ILLEGAL_MEMORY,
    ),
    ("RuntimeError", "CUDA error: uncorrectable ECC error encountered", C.ECC),
    ("RuntimeError", "CUDA error: device-side assert triggered", C.CUDA_ERROR),
    ("RuntimeError", "Found no NVIDIA driver on your system.", C.GPU_DRIVER),
    ("NonFiniteLossError", "non-finite loss nan at step 3", C.NAN_LOSS),
    ("KeyError", "'weight'", C.SOFTWARE_OTHER),
    ("ValueError", "shapes do not match", C.SOFTWARE_OTHER),
]


@pytest.mark.parametrize(("exc_type", "message", "expected"), CASES)
def test_real_messages_get_their_category(exc_type: str, message: str, expected: C) -> None:
    assert classify_text(exc_type, message) is expected


def test_the_cause_of_a_wrapped_exception_counts() -> None:
    try:
        try:
            raise ConnectionResetError("[Errno 104] Connection reset by peer")
        except ConnectionResetError as inner:
            raise RuntimeError("all_reduce failed") from inner
    except RuntimeError as outer:
        assert classify(outer) is C.CONNECTION_RESET


def test_exception_types_are_recognised_without_telling_messages() -> None:
    assert classify(NonFiniteLossError("loss went bad")) is C.NAN_LOSS
    assert classify(MemoryError()) is C.OOM
