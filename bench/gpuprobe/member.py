"""A group rank, the child side of scenarios 1 to 5 (the ``member`` role): it joins, all_reduces
once or in a loop until its peer dies, and is told by the control plane, on stdin, to abort the
group (with one of the abort APIs, timed here) and then to regroup."""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bench.gpuprobe.common import BUF_NUMEL, READY_ITERS, Phase, Record, describe, emit, finish
from bench.gpuprobe.regroup import survivor_regroup
from bench.gpuprobe.torchops import (
    bind,
    device_check,
    import_torch,
    init_group,
    make_model,
    model_check,
    store_client,
    sync,
)

if TYPE_CHECKING:
    import torch


def abort_group(api: str, backend: str) -> Record:
    """Call one abort API on the default group; say whether it exists, returned and how fast."""
    import torch
    import torch.distributed as dist

    c10d = dist.distributed_c10d
    kind = "cuda" if backend == "nccl" else "cpu"
    result: Record = {"api": api}
    start = time.monotonic()
    try:
        target: Any
        if api == "c10d._abort_process_group":
            target = c10d
            name = "_abort_process_group"
        elif api.startswith("pg."):
            target = c10d._get_default_group()
            name = api.removeprefix("pg.")
        else:
            target = c10d._get_default_group()._get_backend(torch.device(kind))
            name = api.removeprefix("backend.")
        fn: Callable[[], object] | None = getattr(target, name, None)
        result["exists"] = fn is not None
        if fn is not None:
            start = time.monotonic()
            fn()
            result["ok"] = True
    except Exception as exc:
        result["ok"] = False
        result["exc"] = describe(exc)
    result["t0"] = start
    result["s"] = time.monotonic() - start
    return result


class Control:
    """The control plane's line channel on stdin: ``abort`` is acted on here, at once, in this
    thread (the stand-in for the agent telling the worker its peer died); other lines are
    queued for the main thread (``regroup``)."""

    def __init__(self, cfg: Record) -> None:
        self.cfg = cfg
        self.lines: queue.Queue[str] = queue.Queue()
        self.aborted_at: float | None = None
        self.abort_result: Record | None = None
        self.abort_done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in sys.stdin:
            line = raw.strip()
            if line == "abort":
                emit("abort_calling", api=self.cfg["abort_api"])
                self.aborted_at = time.monotonic()
                self.abort_result = abort_group(self.cfg["abort_api"], self.cfg["backend"])
                emit("abort_returned", **self.abort_result)
                self.abort_done.set()
            elif line:
                self.lines.put(line)


def role_member(cfg: Record) -> None:
    """A rank: join, all_reduce once (``once``) or loop until killed / failed (``loop``)."""
    emit("started")
    import_torch(distributed=True)
    emit("imported")
    device = bind(cfg)
    emit("device_ready")
    model, reference, ptr = make_model(device)
    control = Control(cfg) if cfg.get("abort_api") else None
    phase = Phase("store")
    try:
        buf = _first_all_reduce(cfg, device, phase)
        if cfg["mode"] == "once":
            finish()
        _loop(device, buf, control, phase)
    except Exception as exc:
        emit("raised", phase=phase.name, exc=describe(exc))
    if control is not None and not control.abort_done.is_set():
        # Raised before the control plane's abort came (gloo does at once): wait for it, so
        # that the abort always runs, and before the regroup.
        emit("abort_wait", done=control.abort_done.wait(cfg.get("abort_wait_s", 10.0)))
    emit("device_check", **device_check(device))
    emit("model_check", **model_check(model, reference, ptr))
    if control is not None and cfg.get("regroup"):
        survivor_regroup(cfg, control.lines, device, (model, reference, ptr))
    finish()


def _first_all_reduce(cfg: Record, device: torch.device, phase: Phase) -> torch.Tensor:
    """Join generation 0 and all_reduce rank + 1 once; the buffer, for the loop."""
    import torch
    import torch.distributed as dist

    store = store_client(cfg)
    phase.name = "init_process_group"
    init_group(cfg, store, cfg["prefix"], device if cfg.get("eager") else None)
    emit("init_done")
    buf = torch.empty(BUF_NUMEL, device=device)
    phase.name = "first_all_reduce"
    buf.fill_(float(cfg["rank"] + 1))
    dist.all_reduce(buf)
    sync(device)
    value = float(buf[0].item())
    expected = float(sum(range(1, cfg["world"] + 1)))
    emit("first_all_reduce", value=value, expected=expected, ok=value == expected)
    return buf


def _loop(device: torch.device, buf: torch.Tensor, control: Control | None, phase: Phase) -> None:
    """All_reduce until it raises, or until three more have returned after an abort."""
    import torch.distributed as dist

    iterations = 0
    after_abort = 0
    next_report = time.monotonic() + 2.0
    while True:
        phase.name = "all_reduce"
        buf.fill_(1.0)
        dist.all_reduce(buf)
        phase.name = "synchronize"
        sync(device)
        iterations += 1
        if iterations == READY_ITERS:
            emit("ready", iterations=iterations)
        if time.monotonic() >= next_report:  # shows a loop that goes on after the kill
            emit("iterating", iterations=iterations)
            next_report = time.monotonic() + 2.0
        if control is not None and control.aborted_at is not None:
            after_abort += 1
            emit("unblocked", phase=phase.name, iterations=iterations, after_abort=after_abort)
            if after_abort >= 3:
                emit("no_raise_after_abort", iterations=iterations)
                return
