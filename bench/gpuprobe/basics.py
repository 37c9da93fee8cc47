"""The basics, scenarios 0 and 1: versions and the abort APIs torch.distributed exposes (the
``versions`` role), and two ranks sharing one GPU, with and without a host id per process."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any

from bench.gpuprobe.common import Record, emit, finish
from bench.gpuprobe.harness import Child, between
from bench.gpuprobe.torchops import import_torch

if TYPE_CHECKING:
    from bench.gpuprobe.probe import Probe


def role_versions(cfg: Record) -> None:
    """Versions, the device, and which abort/shutdown APIs torch.distributed exposes."""
    emit("started")
    import_torch()
    import torch
    import torch.distributed as dist

    facts: Record = {
        "python": sys.version,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "nccl_available": dist.is_nccl_available(),
    }
    if torch.cuda.is_available():
        facts["device_name"] = torch.cuda.get_device_name(0)
        facts["device_count"] = torch.cuda.device_count()
        free, total = torch.cuda.mem_get_info(0)
        facts["mem_free_total"] = [free, total]
        with contextlib.suppress(Exception):
            facts["nccl_version"] = str(torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
    facts["abort_like_names"] = _abort_like_names()
    emit("versions", **facts)
    finish()


def _abort_like_names() -> Record:
    """Per object of torch.distributed, its names that sound like abort or shutdown."""
    import torch
    import torch.distributed as dist

    words = ("abort", "shutdown", "destroy", "terminate", "reset", "finalize", "shrink", "comm_")
    found: Record = {}
    c10d = dist.distributed_c10d
    objects: dict[str, Any] = {"torch.distributed.distributed_c10d": c10d, "ProcessGroup": None}
    objects["ProcessGroup"] = getattr(dist, "ProcessGroup", None)
    objects["Backend(C)"] = getattr(torch._C._distributed_c10d, "Backend", None)
    objects["ProcessGroupNCCL"] = getattr(dist, "ProcessGroupNCCL", None)
    objects["ProcessGroupGloo"] = getattr(dist, "ProcessGroupGloo", None)
    objects["Work"] = getattr(dist, "Work", None)
    for label, obj in objects.items():
        if obj is not None:
            found[label] = sorted(n for n in dir(obj) if any(w in n.lower() for w in words))
    return found


def s0_versions(probe: Probe) -> Record:
    """Scenario 0: the versions, also kept at the top level of the JSON."""
    child = probe.spawn("versions", "versions", {}, probe.env())
    found = child.wait_event("versions", timeout=min(60, probe.left()))
    if found is None:
        return {"outcome": "failed: no versions"}
    probe.facts["versions"] = {k: v for k, v in found.items() if k not in ("event", "t")}
    key = f"torch {found['torch']} nccl {found.get('nccl_version')} {found.get('device_name')}"
    return {"outcome": "ok", "key": key}


def _two_ranks(probe: Probe, scenario: str, hostid: bool, wait_s: float) -> list[Child]:
    """Two ranks that all_reduce once, each with its own host id or with none; waited on."""
    _server, port = probe.store()
    kids = [
        probe.spawn(
            f"{scenario}_r{rank}",
            "member",
            probe.member_cfg(scenario, rank, port=port, mode="once"),
            probe.env(NCCL_HOSTID=f"probe-{scenario}-host{rank}" if hostid else None),
        )
        for rank in (0, 1)
    ]
    for kid in kids:
        kid.wait_exit(min(wait_s, probe.left()))
    return kids


def s1_two_ranks(probe: Probe) -> Record:
    """Two ranks on cuda:0. ``NCCL_HOSTID`` per process is a test-only trick: NCCL then
    takes the two processes for two hosts; with one host id it refuses two ranks on one
    device ("Duplicate GPU detected")."""
    kids = _two_ranks(probe, "s1", hostid=True, wait_s=90)
    phases = []
    ok = True
    for kid in kids:
        first = kid.event("first_all_reduce")
        ok = ok and first is not None and bool(first["ok"])
        phases.append(
            {
                "rank": kid.name,
                "interpreter_s": kid.after("started", kid.spawn_t),
                "import_torch_s": between(kid, "started", "imported"),
                "cuda_context_s": between(kid, "imported", "device_ready"),
                "init_process_group_s": between(kid, "device_ready", "init_done"),
                "first_all_reduce_s": between(kid, "init_done", "first_all_reduce"),
                "raised": (kid.event("raised") or {}).get("exc"),
            }
        )
    first_s = [p["first_all_reduce_s"] for p in phases]
    return {
        "outcome": "ok: all_reduce correct" if ok else "failed",
        "key": f"first all_reduce (incl. comm init) {first_s} s",
        "phases": phases,
    }


def s1_duplicate(probe: Probe) -> Record:
    """Scenario 1 without ``NCCL_HOSTID``: NCCL's error for two ranks on one GPU."""
    kids = _two_ranks(probe, "s1dup", hostid=False, wait_s=30)
    errors = {kid.name: kid.event("raised") for kid in kids}
    worked = [kid.name for kid in kids if kid.event("first_all_reduce") is not None]
    texts = {k: v["exc"]["text"] for k, v in errors.items() if v is not None}
    if worked and not texts:
        outcome = "no error: two ranks shared a GPU with one host id"
    elif texts:
        outcome = "error as expected"
    else:
        outcome = "hung or died without a Python error"
    dup = any("Duplicate GPU" in t for t in texts.values())
    return {
        "outcome": outcome,
        "key": f"'Duplicate GPU' in text: {dup}",
        "errors": errors,
        "worked": worked,
    }
