"""Out of memory and step time, scenarios 7 and 9: a real CUDA out-of-memory error's text and
that the process works on after it (the ``oom`` role), and a reference training step of about
10 ms to size recovery costs against (the ``step`` role)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from bench.gpuprobe.common import Record, describe, emit, finish
from bench.gpuprobe.torchops import bind, device_check, import_torch, sync

if TYPE_CHECKING:
    import torch
    from torch import nn

    from bench.gpuprobe.probe import Probe


def role_oom(cfg: Record) -> None:
    """Two real CUDA out-of-memory errors (1 TiB, 150 GiB), then ordinary work."""
    emit("started")
    import_torch()
    import torch

    device = bind(cfg)
    emit("device_ready")
    for label, nbytes in (("1TiB", 1 << 40), ("150GiB", 150 << 30)):
        start = time.monotonic()
        try:
            block = torch.empty(nbytes, dtype=torch.uint8, device=device)
            emit("oom", label=label, raised=False, bytes=nbytes, numel=block.numel())
            del block
        except BaseException as exc:
            emit("oom", label=label, raised=True, s=time.monotonic() - start, exc=describe(exc))
    emit("device_check", **device_check(device))
    emit("memory", allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved())
    finish()


def s7_oom(probe: Probe) -> Record:
    """Scenario 7: the OOM texts, and a device check after them."""
    child = probe.solo("s7_oom", "oom", 60)
    ooms = [e for e in child.events if e["event"] == "oom"]
    check = child.event("device_check") or {}
    raised = all(e.get("raised") for e in ooms) and len(ooms) == 2
    types = sorted({e["exc"]["type"] for e in ooms if e.get("exc")})
    return {
        "outcome": "ok: OOM raised, device works after" if raised and check.get("ok") else "?",
        "key": f"{types} device_check={check.get('ok')}",
        "ooms": ooms,
        "device_check": check,
    }


def _mlp(width: int, layers: int, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A stack of transformer-like MLP blocks."""
    from torch import nn

    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [
            nn.LayerNorm(width),
            nn.Linear(width, 4 * width),
            nn.GELU(),
            nn.Linear(4 * width, width),
        ]
    return nn.Sequential(*blocks).to(device=device, dtype=dtype)


def _timed(step: Callable[[], None], device: torch.device, warmup: int, steps: int) -> list[float]:
    """``steps`` step times in ms after ``warmup`` steps, sorted; CUDA events on a GPU."""
    import torch

    for _ in range(warmup):
        step()
    sync(device)
    times: list[float] = []
    for _ in range(steps):
        if device.type == "cuda":
            begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begin.record()
            step()
            end.record()
            end.synchronize()
            times.append(float(begin.elapsed_time(end)))
        else:
            start = time.perf_counter()
            step()
            times.append((time.perf_counter() - start) * 1000)
    return sorted(times)


def role_step(cfg: Record) -> None:
    """A reference training step: an MLP stack forward+backward+SGD sized to ~10 ms."""
    emit("started")
    import_torch()
    import torch

    device = bind(cfg)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    width, layers = (2048, 4) if cuda else (128, 2)
    model = _mlp(width, layers, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def measure(tokens: int, warmup: int, steps: int) -> list[float]:
        x = torch.randn(tokens, width, device=device, dtype=dtype)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            loss = model(x).float().pow(2).mean()
            loss.backward()
            optimizer.step()

        return _timed(step, device, warmup, steps)

    tokens = 4096 if cuda else 32
    trial = measure(tokens, 3, 5)
    target_ms = 10.0
    if cuda:
        scaled = tokens * target_ms / trial[len(trial) // 2]
        tokens = max(256, min(65536, round(scaled / 128) * 128))
    times = measure(tokens, 10, 50)
    p50 = times[len(times) // 2]
    emit(
        "step",
        width=width,
        layers=layers,
        tokens=tokens,
        params=params,
        dtype=str(dtype),
        calibration_ms=trial,
        p10_ms=times[len(times) // 10],
        p50_ms=p50,
        p90_ms=times[len(times) * 9 // 10],
        tflops_at_p50=6 * params * tokens / (p50 / 1000) / 1e12,
        timer="cuda events" if cuda else "perf_counter",
    )
    finish()


def s9_step(probe: Probe) -> Record:
    """Scenario 9: the reference step's time."""
    child = probe.solo("s9_step", "step", 120)
    found = child.event("step")
    if found is None:
        return {"outcome": "failed"}
    key = (
        f"p50 {found['p50_ms']:.2f} ms, {found['layers']}x{found['width']} "
        f"{found['tokens']} tokens {found['dtype']}"
    )
    return {"outcome": "ok", "key": key, "step": found}
