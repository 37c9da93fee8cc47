"""Peer death and abort, scenarios 2 and 3 (the orchestrator's side; the ranks are ``member``
children): what a survivor sees when its peer is SIGKILLed, per
``TORCH_NCCL_ASYNC_ERROR_HANDLING``, and which abort API frees it, how fast, model intact."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from bench.gpuprobe.common import Record, fmt, signal_name
from bench.gpuprobe.harness import Child

if TYPE_CHECKING:
    from bench.gpuprobe.probe import Probe


def pair(
    probe: Probe, scenario: str, env: Record, pg_timeout_s: float, **survivor_cfg: Any
) -> tuple[Child, Child, int]:
    """Rank 0 (the survivor) and rank 1 (the victim), both looping on all_reduce."""
    _server, port = probe.store()
    survivor, victim = (
        probe.spawn(
            f"{scenario}_r{rank}",
            "member",
            probe.member_cfg(scenario, rank, port=port, pg_timeout_s=pg_timeout_s, **extra),
            probe.env(NCCL_HOSTID=f"probe-{scenario}-host{rank}", **env),
        )
        for rank, extra in ((0, survivor_cfg), (1, {}))
    )
    return survivor, victim, port


def abort_env() -> Record:
    """The environment of ranks that are to be aborted."""
    # _abort_process_group's docstring: use it with async error handling off, so the
    # watchdog does not handle (or kill for) the error first.
    return {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}


def s2_peer_death(probe: Probe, aeh: str | None) -> Record:
    """Scenario 2: kill the peer; does the survivor raise, die or hang, and how soon?"""
    label = "unset" if aeh is None else aeh
    scenario = f"s2aeh{label}"
    survivor, victim, _port = pair(
        probe, scenario, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": aeh}, probe.pg_timeout_s
    )
    if survivor.wait_event("ready", timeout=min(60, probe.left())) is None:
        return {"outcome": "failed: pair never ready"}
    t_kill = victim.kill()
    wait = min(probe.pg_timeout_s + probe.s2_wait_s, probe.left())
    seen = survivor.wait_event("raised", "unblocked", timeout=wait)
    if seen is not None:
        survivor.wait_event("finished", timeout=min(20, probe.left()))
    survivor.wait_exit(min(3, probe.left()))
    result: Record = {"aeh": label, "pg_timeout_s": probe.pg_timeout_s}
    if seen is not None and seen["event"] == "raised":
        result["fate"] = "raised in Python"
        result["after_kill_s"] = round(seen["t"] - t_kill, 4)
        result["phase"] = seen["phase"]
        result["exc"] = seen["exc"]
    elif survivor.exit_t is not None:
        result["fate"] = f"process died ({signal_name(survivor.proc.returncode)})"
        result["after_kill_s"] = round(survivor.exit_t - t_kill, 4)
    else:
        result["fate"] = f"no exception and alive {wait:.0f} s after the kill (hung)"
    result["device_check"] = survivor.event("device_check")
    result["model_check"] = survivor.event("model_check")
    result["survivor_exit"] = signal_name(survivor.proc.poll())
    going = [e for e in survivor.events if e["event"] == "iterating" and e["t"] > t_kill]
    if going:  # all_reduce kept "completing" after the peer was dead
        result["iterations_after_kill"] = going[-1]["iterations"]
    intact = (result["model_check"] or {}).get("intact")
    key = f"{result['fate']} after {result.get('after_kill_s')} s; model intact={intact}"
    return {"outcome": result["fate"][:28], "key": key, **result}


def kill_and_abort(probe: Probe, survivor: Child, victim: Child) -> tuple[Record, float]:
    """Kill the peer; 0.2 s later the control plane tells the survivor to abort."""
    t_kill = victim.kill()
    time.sleep(0.2)
    survivor.send("abort")
    returned = survivor.wait_event("abort_returned", timeout=min(12, probe.left()))
    unblocked = survivor.wait_event("raised", "no_raise_after_abort", timeout=min(12, probe.left()))
    calling = survivor.event("abort_calling")
    first = survivor.event("unblocked") or unblocked
    t_abort = (returned or {}).get("t0") or (calling or {}).get("t")
    result: Record = {
        "abort": returned,
        "abort_call_after_kill_s": None if t_abort is None else round(t_abort - t_kill, 4),
        "main_thread_unblocked": first,
        "raised": survivor.event("raised"),
    }
    if first is not None and t_abort is not None:
        result["unblocked_after_abort_s"] = round(first["t"] - t_abort, 4)
    if result["raised"] is not None and t_abort is not None:
        result["raised_after_abort_s"] = round(result["raised"]["t"] - t_abort, 4)
    if first is not None:  # the main thread is free: its checks follow
        survivor.wait_event("model_check", timeout=min(20, probe.left()))
    result["device_check"] = survivor.event("device_check")
    result["model_check"] = survivor.event("model_check")
    return result, t_kill


def s3_abort(probe: Probe, api: str) -> Record:
    """Scenario 3: kill the peer, abort with ``api``; is the survivor freed, and usable?"""
    scenario = "s3" + "".join(ch for ch in api if ch.isalnum())
    survivor, victim, _port = pair(probe, scenario, abort_env(), 60, abort_api=api)
    if survivor.wait_event("ready", timeout=min(60, probe.left())) is None:
        return {"outcome": "failed: pair never ready", "api": api}
    result, _ = kill_and_abort(probe, survivor, victim)
    survivor.wait_exit(min(10, probe.left()))
    result["survivor_exit"] = signal_name(survivor.proc.poll())
    abort = result["abort"] or {}
    freed = bool(abort.get("ok") and result.get("unblocked_after_abort_s") is not None)
    works = freed and bool((result["device_check"] or {}).get("ok"))
    if works:
        probe.abort_apis_working.append(api)
    early = (result.get("unblocked_after_abort_s") or 0.0) < 0
    if abort.get("exists") is False:
        outcome = "API missing"
    elif abort == {}:
        outcome = "abort call never returned"
    elif works and early:
        outcome = "raised before abort; abort ok"
    elif works:
        outcome = "works"
    elif freed:
        outcome = "abort ok, then process hung"  # freed, but its checks never came
    else:
        outcome = "does not work"
    key = (
        f"abort call {fmt(abort.get('s'))} s; main thread free "
        f"{fmt(result.get('unblocked_after_abort_s'))} s after it; "
        f"model intact={(result['model_check'] or {}).get('intact')}"
    )
    return {"outcome": outcome, "key": key, "api": api, **result}
