"""Aborting a communicator's init, scenario 6: rank 0 of two starts an eager, non-blocking
NCCL init whose peer never comes (the ``nonblocking`` role); a thread calls an abort API a few
seconds later. Does the stuck init raise, and how soon after the abort?"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from bench.gpuprobe.common import ABORT_APIS, BUF_NUMEL, Phase, Record, describe, emit, finish
from bench.gpuprobe.harness import Child
from bench.gpuprobe.member import abort_group
from bench.gpuprobe.torchops import bind, device_check, import_torch, init_group, store_client, sync

if TYPE_CHECKING:
    from bench.gpuprobe.probe import Probe


def role_nonblocking(cfg: Record) -> None:
    """Rank 0 of two with eager, non-blocking communicator init; rank 1 never comes."""
    emit("started")
    import_torch()
    import torch.distributed as dist

    device = bind(cfg)
    emit("device_ready")

    def abort_later() -> None:
        time.sleep(cfg["abort_after_s"])
        emit("abort_calling", api=cfg["abort_api"], initialized=dist.is_initialized())
        emit("abort_returned", **abort_group(cfg["abort_api"], cfg["backend"]))

    threading.Thread(target=abort_later, daemon=True).start()
    phase = Phase("store")
    try:
        store = store_client(cfg)
        phase.name = "init_process_group"
        init_group(cfg, store, cfg["prefix"], device if cfg["device"] == "cuda" else None)
        emit("init_done")
        import torch

        phase.name = "first_all_reduce"
        buf = torch.ones(BUF_NUMEL, device=device)
        dist.all_reduce(buf)
        phase.name = "synchronize"
        sync(device)
        emit("first_all_reduce", value=float(buf[0].item()))
    except Exception as exc:
        emit("raised", phase=phase.name, exc=describe(exc))
    emit("device_check", **device_check(device))
    finish()


def _spawn(probe: Probe, api: str) -> Child:
    """The lone rank, its abort due 2 s after start-up, async error handling off."""
    _server, port = probe.store()
    pg_timeout = 60.0 if probe.device == "cuda" else 8.0
    return probe.spawn(
        "s6_nonblocking",
        "nonblocking",
        {
            "rank": 0,
            "world": 2,
            "port": port,
            "prefix": "s6/gen0",
            "pg_timeout_s": pg_timeout,
            "abort_api": api,
            "abort_after_s": 2.0,
        },
        probe.env(
            NCCL_HOSTID="probe-s6-host0",
            TORCH_NCCL_USE_COMM_NONBLOCKING="1",
            TORCH_NCCL_ASYNC_ERROR_HANDLING="0",
        ),
    )


def s6_nonblocking(probe: Probe) -> Record:
    """Scenario 6: abort a non-blocking init stuck on a peer that never comes."""
    api = (probe.abort_apis_working or list(ABORT_APIS))[0]
    child = _spawn(probe, api)
    calling = child.wait_event("abort_calling", timeout=min(60, probe.left()))
    raised = child.wait_event("raised", "first_all_reduce", timeout=min(25, probe.left()))
    child.wait_event("finished", timeout=min(10, probe.left()))
    returned = child.event("abort_returned")
    result: Record = {
        "api": api,
        "abort_calling": calling,
        "abort_returned": returned,
        "init_done": child.event("init_done"),
        "raised": raised,
        "device_check": child.event("device_check"),
    }
    if raised is not None and calling is not None:
        result["raised_after_abort_s"] = round(raised["t"] - calling["t"], 4)
    if raised is not None and raised["event"] == "raised":
        outcome = f"raised in {raised['phase']}"
    elif raised is not None:
        outcome = "collective completed?!"
    elif calling is not None and returned is None:
        outcome = "abort call never returned"
    else:
        outcome = "still stuck after abort"
    after = result.get("raised_after_abort_s")
    key = f"abort ok={(returned or {}).get('ok')}; raised {after} s after the abort call"
    return {"outcome": outcome, "key": key, **result}
