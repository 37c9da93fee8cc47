"""Exception classification on the texts real failures produce.

Each string is the format its source emits (file and function named in ``trainer/classify``);
addresses, sizes and line numbers are whatever the sample had. "captured" marks strings this
project's torch 2.13 produced on a CPU machine (gloo, TCPStore, the CPU allocator); the GPU
and InfiniBand ones are from the sources and from public bug reports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch.distributed import DistBackendError
from unicron.shared.contracts.taxonomy import FailureCategory as C
from unicron.trainer.classify import RULES, classify, classify_text
from unicron.trainer.parallel import NonFiniteLossError
from unicron.trainer.regroup import is_peer_failure

GLOO = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp"
CUDA_SUFFIX = (
    "\nCUDA kernel errors might be asynchronously reported at some other API call, so the "
    "stacktrace below might be incorrect.\nFor debugging consider passing "
    "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
)
WORK = "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000)"
NCCL_CHECK = "NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
REMOTE = (
    "NCCL error: remote process exited or there was a network error, NCCL version 2.20.5\n"
    "ncclRemoteError: A call failed possibly due to a network error or a remote process "
    "exiting prematurely."
)
UNHANDLED_CUDA = (
    f"{NCCL_CHECK}unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version "
    "2.18.1\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
)
IB_RETRY = (
    "transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer 10.2.0.5<33092> "
    "with error 12, opcode 0, len 0, vendor err 129 (Recv)"
)

# What torch 2.13 raised on gloo (captured) for two ranks' all_reduce of 528 and 1 floats: on
# the rank expecting 4 bytes, gloo's own thread throws, and the process aborts with this what().
GLOO_MISMATCH = (
    f"[enforce fail at {GLOO[1:]}/pair.cc:456] op.preamble.length <= op.nbytes. 2112 vs 4. "
    "Received data size doesn't match expected size. Is there a distributed collective "
    "mismatch in your code?"
)
# The same run with TORCH_DISTRIBUTED_DEBUG=DETAIL: torch checks the collectives first.
FINGERPRINT = (
    "CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[{}], "
    "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, "
    "layout=Strided (default), requires_grad=false (default), pinned_memory=false (default), "
    "memory_format=(nullopt)))"
)
DETAIL_MISMATCH = (
    f"Detected mismatch between collectives on ranks. Rank 0 is running collective: "
    f"{FINGERPRINT.format(528)}, but Rank 1 is running collective: {FINGERPRINT.format(1)}."
    "Collectives differ in the following aspects:   Tensor Tensor shapes: 528vs 1"
)

# (id, exception type, message, category); laid out as a table, one case per entry.
# fmt: off
CASES = [
    # --- collective timeouts
    ("nccl-watchdog", "DistBackendError",
     f"[PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught collective operation timeout: "
     f"{WORK} ran for 600081 milliseconds before timing out.", C.NCCL_TIMEOUT),
    ("nccl-blocking-wait", "DistBackendError",
     f"[Rank 3] Work {WORK} timed out in blocking wait (TORCH_NCCL_BLOCKING_WAIT=1).",
     C.NCCL_TIMEOUT),
    ("gloo-recv-timeout (captured)", "RuntimeError",
     f"{GLOO}/unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation to complete",
     C.NCCL_TIMEOUT),
    # --- NCCL errors without a more specific cause
    ("nccl-system-error", "DistBackendError",
     f"{NCCL_CHECK}unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version "
     "2.19.3\nncclSystemError: System call (e.g. socket, malloc) or external library call "
     "failed or device error.", C.NCCL_ERROR),
    ("nccl-remote-error: a peer gone", "DistBackendError", REMOTE, C.CONNECTION_RESET),
    # --- GPU hardware
    ("cuda-ecc", "RuntimeError", "CUDA error: uncorrectable ECC error encountered" + CUDA_SUFFIX,
     C.ECC),
    ("xid-48-dbe", "RuntimeError",
     "NVRM: Xid (PCI:0000:83:00): 48, pid=2311, An uncorrectable double bit error (DBE) has "
     "been detected on GPU in the framebuffer at partition 6, subpartition 0.", C.ECC),
    ("cuda-nvlink", "RuntimeError",
     "CUDA error: uncorrectable NVLink error detected during the execution" + CUDA_SUFFIX,
     C.NVLINK),
    ("xid-74-nvlink", "RuntimeError",
     "NVRM: Xid (PCI:0000:07:00): 74, pid=4121, NVLink: fatal error detected on link 3",
     C.NVLINK),
    ("intel-iommu-fault", "RuntimeError",
     "DMAR: [DMA Read NO_PASID] Request device [3b:00.0] fault addr 0xfee00000 [fault reason "
     "0x06] PTE Read access is not set", C.INVALID_DMA),
    ("amd-iommu-fault", "RuntimeError",
     "nvidia 0000:03:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0010 "
     "address=0x64a7f000 flags=0x0000]", C.INVALID_DMA),
    ("injected-invalid-dma", "RuntimeError", "invalid DMA mapping on GPU 3", C.INVALID_DMA),
    ("cuda-illegal-address", "RuntimeError",
     "CUDA error: an illegal memory access was encountered" + CUDA_SUFFIX, C.ILLEGAL_MEMORY),
    ("xid-31-mmu-fault", "RuntimeError",
     "NVRM: Xid (PCI:0000:00:06): 31, pid=79749, name=exe, Ch 0000000a, intr 00000000. MMU "
     "Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_T1_7 faulted @ 0x2b57_b3000000. Fault is of type "
     "FAULT_PDE ACCESS_TYPE_VIRT_WRITE", C.ILLEGAL_MEMORY),
    ("cuda-launch-failure", "RuntimeError", "CUDA error: unspecified launch failure" + CUDA_SUFFIX,
     C.CUDA_ERROR),
    ("cuda-invalid-ordinal", "RuntimeError", "CUDA error: invalid device ordinal" + CUDA_SUFFIX,
     C.CUDA_ERROR),
    ("cuda-device-assert", "RuntimeError", "CUDA error: device-side assert triggered",
     C.CUDA_ERROR),
    ("cuda-insufficient-driver", "RuntimeError",
     "CUDA error: CUDA driver version is insufficient for CUDA runtime version" + CUDA_SUFFIX,
     C.GPU_DRIVER),
    ("cuda-unknown-error", "RuntimeError", "CUDA error: unknown error" + CUDA_SUFFIX,
     C.GPU_DRIVER),
    ("torch-no-driver", "RuntimeError", "Found no NVIDIA driver on your system.", C.GPU_DRIVER),
    ("xid-79-off-the-bus", "RuntimeError",
     "NVRM: Xid (PCI:0000:3b:00): 79, pid=1122, GPU has fallen off the bus.", C.GPU_DRIVER),
    # --- memory
    ("cuda-oom", "OutOfMemoryError",
     "CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 14.57 GiB "
     "of which 1.58 GiB is free. Including non-PyTorch memory, this process has 966.00 MiB "
     "memory in use. Of the allocated memory 734.07 MiB is allocated by PyTorch, and 33.93 MiB "
     "is reserved by PyTorch but unallocated.", C.OOM),
    ("cuda-oom-before-2.2", "OutOfMemoryError",
     "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; "
     "75.02 GiB already allocated; 1.03 GiB free; 77.50 GiB reserved in total by PyTorch)",
     C.OOM),
    ("cpu-oom (captured)", "RuntimeError",
     "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
     "you tried to allocate 281474976710656 bytes. Error code 12 (Cannot allocate memory)",
     C.OOM),
    # --- network
    ("c10d-connect-refused", "DistNetworkError",
     "The client socket has failed to connect to any network address of (10.0.0.1, 29500). "
     "The client socket has failed to connect to [node-a]:29500 (errno: 111 - Connection "
     "refused).", C.CONNECTION_REFUSED),
    ("gloo-connect-refused", "RuntimeError",
     "[enforce fail at ../third_party/gloo/gloo/transport/tcp/socket.cc:142] rv != -1. -1 vs "
     "-1. connect: Connection refused", C.CONNECTION_REFUSED),
    ("gloo-closed-by-peer (captured)", "RuntimeError",
     f"{GLOO}/pair.cc:553] Connection closed by peer [127.0.0.1]:59622. This is typically "
     "caused by a remote worker crashing. Check the logs of the remote worker before "
     "reporting an error. GLHF! 🏖️", C.CONNECTION_RESET),
    ("gloo-read-reset", "RuntimeError",
     f"{GLOO}/pair.cc:534] Read error [127.0.0.1]:41235: Connection reset by peer",
     C.CONNECTION_RESET),
    ("gloo-write-broken-pipe", "RuntimeError",
     f"{GLOO}/pair.cc:339] Write error [127.0.0.1]:41235: Broken pipe", C.CONNECTION_RESET),
    ("c10d-reset", "DistNetworkError", "Connection reset by peer", C.CONNECTION_RESET),
    ("c10d-recv-closed", "DistNetworkError",
     "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server "
     "shutdown or crash?", C.CONNECTION_RESET),
    ("nccl-ib-port-error-2.18", "RuntimeError",
     "NCCL WARN NET/IB : mlx5_0:1 Got async event : port error", C.LINK_FLAPPING),
    ("nccl-ib-port-error", "RuntimeError",
     "NCCL WARN NET/IB : mlx5_2:1 Got non-fatal async event: port error(10)", C.LINK_FLAPPING),
    ("ufm-port-down", "RuntimeError", "Switch port state changed to DOWN", C.LINK_FLAPPING),
    ("nccl-ib-retry-exceeded", "RuntimeError", IB_RETRY, C.LINK_FLAPPING),
    ("nccl-ib-retry-exceeded-2.27", "RuntimeError",
     "NET/IB: Got completion from peer 10.153.235.13<40554> with "
     "status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RECV_RDMA_WITH_IMM(129) vendor_err=129 "
     "localGid ::ffff:1.1.2.2 remoteGids::ffff:1.1.1.4 hca mlx5_1", C.LINK_FLAPPING),
    ("nccl-ib-local-protection", "RuntimeError",
     "NET/IB: Got completion from peer 10.99.91.63<51161> with status=4 opcode=32614 "
     "len=32614 vendor err 81 (Send) localGid ::ffff:10.99.92.59 hca mlx5_1", C.NETWORK_OTHER),
    ("c10d-connect-timeout (captured)", "DistNetworkError",
     "The client socket has timed out after 1000ms while trying to connect to "
     "(127.0.0.1, 42477).", C.NETWORK_OTHER),
    ("store-wait-timeout (captured)", "DistStoreError", "wait timeout after 300ms, keys: /k",
     C.NETWORK_OTHER),
    ("store-clients-timeout (captured)", "DistStoreError",
     "Timed out after 2 seconds waiting for clients. 1/2 clients joined.", C.NETWORK_OTHER),
    ("c10d-socket-timeout", "DistNetworkError", "Socket Timeout", C.NETWORK_OTHER),
    ("no-route", "OSError", "[Errno 113] No route to host", C.NETWORK_OTHER),
    # --- the ranks disagree on a collective
    ("torch-detail-mismatch (captured)", "RuntimeError", DETAIL_MISMATCH,
     C.COLLECTIVE_MISMATCH),
    # --- the rest
    ("nan-loss", "NonFiniteLossError", "non-finite loss nan at step 3", C.NAN_LOSS),
    ("key-error", "KeyError", "'weight'", C.SOFTWARE_OTHER),
    ("value-error", "ValueError", "shapes do not match", C.SOFTWARE_OTHER),
]

# A more specific cause wins over the wrapper or the generic text around it.
PRECEDENCE = [
    ("timeout-not-network: watchdog with the abort notice", "DistBackendError",
     f"[Rank 1] Watchdog caught collective operation timeout: {WORK} ran for 600013 "
     "milliseconds before timing out.\n[Rank 1] Some NCCL operations have failed or timed out. "
     "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
     "corrupted/incomplete data.", C.NCCL_TIMEOUT),
    ("ecc-not-cuda", "RuntimeError",
     f"{UNHANDLED_CUDA}Cuda failure 'uncorrectable ECC error encountered'", C.ECC),
    ("nvlink-not-ecc: 'uncorrectable' alone is no ECC", "RuntimeError",
     "CUDA error: uncorrectable NVLink error detected during the execution", C.NVLINK),
    ("illegal-not-nccl", "DistBackendError",
     f"{UNHANDLED_CUDA}Cuda failure 'an illegal memory access was encountered'",
     C.ILLEGAL_MEMORY),
    ("cuda-not-nccl", "DistBackendError",
     f"{UNHANDLED_CUDA}Cuda failure 'unspecified launch failure'", C.CUDA_ERROR),
    ("oom-not-cuda", "RuntimeError", "CUDA error: out of memory" + CUDA_SUFFIX, C.OOM),
    ("refused-not-nccl", "DistBackendError",
     f"{NCCL_CHECK}internal error, NCCL version 2.14.3\nncclInternalError: Internal check "
     "failed.\nLast error:\nNet : Call to recv from 10.58.226.18<38309> failed : Connection "
     "refused", C.CONNECTION_REFUSED),
    ("reset-not-nccl", "DistBackendError",
     f"{REMOTE}\nLast error:\nsocketProgress: Connection closed by remote peer "
     "gpu-node1.cluster<45074>", C.CONNECTION_RESET),
    ("flapping-not-nccl", "DistBackendError", f"{REMOTE}\nLast error:\n{IB_RETRY}",
     C.LINK_FLAPPING),
    ("mismatch-not-network: gloo's enforce names its transport (captured)",
     "gloo::EnforceNotMet", GLOO_MISMATCH, C.COLLECTIVE_MISMATCH),
    ("driver-not-link: a GPU off the bus also takes its PCIe link down", "RuntimeError",
     "pciehp 0000:3a:00.0: Slot(1): Link Down\nNVRM: Xid (PCI:0000:3b:00): 79, pid=1122, GPU "
     "has fallen off the bus.", C.GPU_DRIVER),
]
# fmt: on


def _ids(cases: list[tuple[str, str, str, C]]) -> list[str]:
    return [case[0] for case in cases]


@pytest.mark.parametrize(("name", "exc_type", "message", "expected"), CASES, ids=_ids(CASES))
def test_real_messages_get_their_category(
    name: str, exc_type: str, message: str, expected: C
) -> None:
    assert classify_text(exc_type, message) is expected


@pytest.mark.parametrize(
    ("name", "exc_type", "message", "expected"), PRECEDENCE, ids=_ids(PRECEDENCE)
)
def test_the_specific_cause_wins(name: str, exc_type: str, message: str, expected: C) -> None:
    assert classify_text(exc_type, message) is expected


def test_every_category_the_classifier_can_name_has_a_real_string() -> None:
    named = {category for category, _ in RULES} | {C.SOFTWARE_OTHER}
    assert named <= {case[3] for case in CASES}


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


H200 = json.loads((Path(__file__).parent / "data" / "nccl_texts_h200.json").read_text())["texts"]
# What a survivor saw on an H200 when its peer was SIGKILLed, and what its next collective
# raised once the communicator was aborted (docs/gpu-probe.md): each must park it.
PEER_DEATH = [
    "peer_death_watchdog_async_error_closed",
    "peer_death_watchdog_async_error_reset",
    "peer_death_nccl_warn_closed",
    "peer_death_nccl_warn_reset",
    "abort_next_collective",
]


@pytest.mark.parametrize("name", PEER_DEATH)
def test_nccl_s_texts_of_a_dead_peer_are_peer_failures(name: str) -> None:
    assert is_peer_failure(DistBackendError(H200[name]))


@pytest.mark.parametrize("name", ["oom_1tib", "duplicate_gpu_rank0"])
def test_an_nccl_rank_s_own_fault_is_not_a_peer_failure(name: str) -> None:
    assert not is_peer_failure(DistBackendError(H200[name]))


@pytest.mark.parametrize("name", ["duplicate_gpu_rank0", "duplicate_gpu_rank1"])
def test_nccl_s_invalid_usage_is_the_job_s_own(name: str) -> None:
    # Two ranks on one GPU: NCCL refuses what the job asked of it, on any node.
    assert classify(DistBackendError(H200[name])) is C.COLLECTIVE_MISMATCH


def test_a_collective_mismatch_is_not_a_peer_failure() -> None:
    # A rank that parked to wait for a regroup would meet the same mismatch again.
    assert not is_peer_failure(RuntimeError(DETAIL_MISMATCH))
    assert not is_peer_failure(RuntimeError(GLOO_MISMATCH))
