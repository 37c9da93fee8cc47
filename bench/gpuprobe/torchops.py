"""A child's torch helpers: bind the device, hold and check the "model", reach the
orchestrator's store, join a group (through c10d or as a bare backend object) and all_reduce
on it. torch is imported inside each function, so that the roles decide when it is loaded."""

from __future__ import annotations

import importlib
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from bench.gpuprobe.common import BUF_NUMEL, MODEL_NUMEL, Record, describe

if TYPE_CHECKING:
    import torch


def import_torch(distributed: bool = False) -> None:
    """Load torch (one CPU thread), and torch.distributed too where asked."""
    import torch

    torch.set_num_threads(1)
    if distributed:
        importlib.import_module("torch.distributed")


def bind(cfg: Record) -> torch.device:
    """Bind the device and create its context (a tiny op that must complete)."""
    import torch

    if cfg["device"] == "cuda":
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
        torch.zeros(1, device=device).add_(1).item()
        return device
    return torch.device("cpu")


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def device_check(device: torch.device) -> Record:
    """Whether the device still computes: a small op whose result is known."""
    import torch

    start = time.monotonic()
    try:
        x = torch.arange(1024, device=device, dtype=torch.float32)
        value = float((x * 2).sum().item())
        return {"ok": value == 1047552.0, "value": value, "s": time.monotonic() - start}
    except Exception as exc:
        return {"ok": False, "exc": describe(exc), "s": time.monotonic() - start}


def make_model(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The "model" on the device, its reference copy on the CPU, and its data pointer."""
    import torch

    generator = torch.Generator().manual_seed(1234)
    reference = torch.randn(MODEL_NUMEL, generator=generator)
    model = reference.to(device, copy=True)
    return model, reference, model.data_ptr()


def model_check(model: torch.Tensor, reference: torch.Tensor, ptr: int) -> Record:
    """Whether the model still holds its values, at the same address."""
    import torch

    try:
        same = bool(torch.equal(model.cpu(), reference))
        return {"intact": same, "same_data_ptr": model.data_ptr() == ptr}
    except Exception as exc:
        return {"intact": False, "exc": describe(exc)}


def store_client(cfg: Record) -> Any:
    """A client of the orchestrator's TCPStore."""
    import torch.distributed as dist

    return dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", cfg["port"], is_master=False, timeout=timedelta(seconds=60)
    )


def init_group(cfg: Record, store: Any, prefix: str, device: torch.device | None) -> None:
    """c10d's default group under ``prefix``; eager communicator init where a device is given."""
    import torch.distributed as dist

    kwargs: Record = {}
    if device is not None:
        kwargs["device_id"] = device
    dist.init_process_group(
        backend=cfg["backend"],
        store=dist.PrefixStore(prefix, store),  # type: ignore[attr-defined]
        rank=cfg["rank"],
        world_size=cfg["world"],
        timeout=timedelta(seconds=cfg["pg_timeout_s"]),
        **kwargs,
    )


def direct_group(cfg: Record, store: Any, prefix: str) -> Any:
    """A backend object outside c10d's registry: the fallback when destroy_process_group hangs."""
    import torch.distributed as dist

    prefixed = dist.PrefixStore(prefix, store)  # type: ignore[attr-defined]
    if cfg["backend"] == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=cfg["pg_timeout_s"])
        return dist.ProcessGroupNCCL(prefixed, cfg["rank"], cfg["world"], options)
    return dist.ProcessGroupGloo(
        prefixed, cfg["rank"], cfg["world"], timedelta(seconds=cfg["pg_timeout_s"])
    )


def new_group(cfg: Record, store: Any, prefix: str, method: str) -> Any:
    """A new generation's group: a bare backend (``direct``, returned) or c10d's (None)."""
    if method == "direct":
        return direct_group(cfg, store, prefix)
    init_group(cfg, store, prefix, None)
    return None


def rank_buf(cfg: Record, device: torch.device) -> torch.Tensor:
    """The collective's buffer filled with rank + 1 (so two ranks sum to 3.0)."""
    import torch

    return torch.full((BUF_NUMEL,), float(cfg["rank"] + 1), device=device)


def reduce_value(group: Any, buf: torch.Tensor, device: torch.device) -> float:
    """All_reduce ``buf`` on ``group`` (c10d's default group when None), synchronized; its
    first element."""
    import torch.distributed as dist

    if group is None:
        dist.all_reduce(buf)
    else:
        group.allreduce([buf]).wait()
    sync(device)
    return float(buf[0].item())
