"""In-place regroup, scenarios 4 and 5: the survivor leaves its aborted group and joins a new
generation's in the same process, model kept on the device, with a newcomer that is either a
cold replacement process (the ``joiner`` role) or a warm spare (the ``spare`` role: torch
imported, no CUDA touched, until told to go). Each start-up phase of the newcomer is timed."""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from typing import TYPE_CHECKING

from bench.gpuprobe.common import ABORT_APIS, Phase, Record, describe, emit, finish
from bench.gpuprobe.harness import Child, between
from bench.gpuprobe.peer_death import abort_env, kill_and_abort, pair
from bench.gpuprobe.torchops import (
    bind,
    import_torch,
    model_check,
    new_group,
    rank_buf,
    reduce_value,
    store_client,
)

if TYPE_CHECKING:
    import torch

    from bench.gpuprobe.probe import Probe

Model = tuple["torch.Tensor", "torch.Tensor", int]  # the model, its reference copy, data_ptr


# ==== child side =================================================================================


def _leave(cfg: Record) -> str:
    """Destroy the aborted default group, ``destroy_timeout_s`` at most; how to join the next
    one: through c10d again, or ``direct`` (a bare backend) when destroying hung or failed."""
    import torch.distributed as dist

    if not dist.is_initialized():  # _abort_process_group already emptied c10d's registry
        emit("destroy", skipped="not initialized after the abort", s=0.0)
        return "init_process_group"
    outcome: Record = {}

    def destroy() -> None:
        try:
            dist.destroy_process_group()
            outcome["ok"] = True
        except Exception as exc:
            outcome["exc"] = describe(exc)

    start = time.monotonic()
    thread = threading.Thread(target=destroy, daemon=True)
    thread.start()
    thread.join(cfg["destroy_timeout_s"])
    hung = thread.is_alive()
    emit("destroy", hung=hung, s=time.monotonic() - start, **outcome)
    return "direct" if hung or not outcome.get("ok") else "init_process_group"


def survivor_regroup(
    cfg: Record, lines: queue.Queue[str], device: torch.device, model: Model
) -> None:
    """Leave the aborted group and join a new generation's in this process, model kept."""
    method = _leave(cfg)
    emit("regroup_ready", method=method)
    line = lines.get()  # "regroup <json>" from the control plane
    directive = json.loads(line.split(" ", 1)[1])
    start = time.monotonic()
    phase = "store"
    try:
        store = store_client(cfg)
        phase = method
        group = new_group(cfg, store, directive["prefix"], method)
        init_s = time.monotonic() - start
        buf = rank_buf(cfg, device)
        phase = "first_all_reduce"
        value = reduce_value(group, buf, device)
        emit(
            "regrouped",
            method=method,
            value=value,
            ok=value == 3.0,
            init_s=init_s,
            total_s=time.monotonic() - start,
            model=model_check(*model),
        )
    except Exception as exc:
        emit("regroup_failed", phase=phase, method=method, exc=describe(exc))


def role_joiner(cfg: Record) -> None:
    """A replacement started cold: interpreter, ``import torch``, CUDA context, group, step."""
    emit("started")
    import_torch()
    emit("imported")
    _join(cfg)


def role_spare(cfg: Record) -> None:
    """A warm spare: torch imported, no CUDA touched, until a ``go <json>`` line arrives."""
    emit("started")
    import_torch()
    emit("imported")
    line = sys.stdin.readline()
    emit("go_received")
    cfg = {**cfg, **json.loads(line.split(" ", 1)[1])}
    _join(cfg)


def _join(cfg: Record) -> None:
    """The newcomer's join: device, store, group (as the survivor forms it), one all_reduce."""
    phase = Phase("device")
    try:
        device = bind(cfg)
        emit("device_ready")
        phase.name = "store"
        store = store_client(cfg)
        phase.name = cfg["method"]
        group = new_group(cfg, store, cfg["prefix"], cfg["method"])
        emit("init_done")
        phase.name = "first_all_reduce"
        value = reduce_value(group, rank_buf(cfg, device), device)
        emit("joined", value=value, ok=value == 3.0)
    except Exception as exc:
        emit("raised", phase=phase.name, exc=describe(exc))
    finish()


# ==== orchestrator side ==========================================================================


def s45_regroup(probe: Probe, warm: bool) -> Record:
    """Scenario 4 (cold replacement) or 5 (warm spare): kill, abort, regroup, time it all."""
    api = (probe.abort_apis_working or list(ABORT_APIS))[0]
    scenario = "s5warm" if warm else "s4cold"
    survivor, victim, port = pair(
        probe, scenario, abort_env(), 60, abort_api=api, regroup=True, destroy_timeout_s=10
    )
    new_env = probe.env(NCCL_HOSTID=f"probe-{scenario}-host2", **abort_env())
    joiner_cfg: Record = {"rank": 1, "world": 2, "port": port, "prefix": f"{scenario}/gen1"}
    joiner_cfg["pg_timeout_s"] = 60
    spare = probe.spawn(f"{scenario}_spare", "spare", {}, new_env) if warm else None
    if survivor.wait_event("ready", timeout=min(60, probe.left())) is None:
        return {"outcome": "failed: pair never ready", "api": api}
    if spare is not None and spare.wait_event("imported", timeout=min(60, probe.left())) is None:
        return {"outcome": "failed: spare never warm", "api": api}
    result, t_kill = kill_and_abort(probe, survivor, victim)
    ready = survivor.wait_event("regroup_ready", timeout=min(20, probe.left()))
    if ready is None:
        return {"outcome": "failed: survivor never ready to regroup", "api": api, **result}
    joiner_cfg["method"] = method = ready["method"]
    t_directive = time.monotonic()
    if spare is not None:
        spare.send("go " + json.dumps(joiner_cfg))
        newcomer = spare
    else:
        newcomer = probe.spawn(f"{scenario}_cold", "joiner", joiner_cfg, new_env)
    survivor.send("regroup " + json.dumps({"prefix": f"{scenario}/gen1"}))
    done = survivor.wait_event("regrouped", "regroup_failed", timeout=min(90, probe.left()))
    newcomer.wait_event("joined", "raised", timeout=min(10, probe.left()))
    regrouped = survivor.event("regrouped")
    phases = _newcomer_phases(newcomer, spare is not None, t_directive)
    result.update(
        api=api,
        method=method,
        destroy=survivor.event("destroy"),
        survivor_regroup=done,
        survivor_directive_to_regrouped_s=_since(regrouped, t_directive),
        kill_to_regrouped_s=_since(regrouped, t_kill),
        newcomer=newcomer.name,
        newcomer_phases=phases,
        newcomer_error=newcomer.event("raised"),
    )
    return _verdict(result, regrouped, newcomer.event("joined"), warm)


def _since(found: Record | None, origin: float) -> float | None:
    return None if found is None else round(found["t"] - origin, 4)


def _newcomer_phases(newcomer: Child, warm: bool, t_directive: float) -> Record:
    """The newcomer's start-up, phase by phase; a warm spare's from the directive on."""
    origin = t_directive if warm else newcomer.spawn_t
    phases: Record = {
        "process_start_s": None if warm else newcomer.after("started", origin),
        "import_torch_s": None if warm else between(newcomer, "started", "imported"),
        "go_received_s": newcomer.after("go_received", origin) if warm else None,
        "cuda_context_s": between(newcomer, "go_received" if warm else "imported", "device_ready"),
        "init_process_group_s": between(newcomer, "device_ready", "init_done"),
        "first_all_reduce_s": between(newcomer, "init_done", "joined"),
        "directive_to_joined_s": _since(newcomer.event("joined"), origin),
    }
    if warm:
        phases["spare_import_torch_s_beforehand"] = between(newcomer, "started", "imported")
    return phases


def _verdict(result: Record, regrouped: Record | None, joined: Record | None, warm: bool) -> Record:
    """Scenario 4/5's outcome and key figures."""
    model = (regrouped or {}).get("model") or {}
    ok = bool(regrouped and regrouped["ok"] and joined and joined["ok"] and model.get("intact"))
    outcome = "ok: regrouped, model kept" if ok else "failed"
    phases = result["newcomer_phases"]
    key = (
        f"{'warm' if warm else 'cold'} join {phases['directive_to_joined_s']} s; "
        f"survivor {result['survivor_directive_to_regrouped_s']} s; "
        f"same data_ptr={model.get('same_data_ptr')}; via {result['api']}/{result['method']}"
    )
    return {"outcome": outcome, "key": key, **result}
