"""Chaos benchmark (issue 11): faults in workers while the control plane and its servers die.

A seeded run on the real stack (``cli/stack.py``, what ``unicron up`` runs): ``--jobs``
concurrent 2-worker jobs (the built-in GPT and a script on ``unicron.train``, alternately; a
job near its end is followed by a fresh one) on as many 2-slot nodes, ``--faults`` worker
faults of every failing kind (crash, exit, exception, hang) injected through the admin API,
and kill -9 of the api, detector, planner and executor, of one agent, of the embedded NATS and
of the embedded Redis, each at a seeded moment after a seeded fault, usually while that fault
is being recovered from (:mod:`bench.chaos_plan`). With ``--ha`` the stack runs on ``unicron up
--ha``'s servers, and the server faults are kill -9 of one NATS server of three and of the
Redis primary (the Sentinels promote the replica): the same checks must hold.

Before the faults, each workload's job runs once failure-free on the same stack. Afterwards,
from the event stream read from its start and from ``/proc``: each fault must have caused
exactly one ``failure.detected`` (missed, duplicate; a node declared lost whose agent the
bench did not kill is a false node loss, :mod:`bench.chaos_losses`), every job must have
succeeded with the parameters and sample ledger of the failure-free run
(:mod:`bench.chaos_exact`), no worker process may outlive its assignment, before or after the
stack stops; recovery is each fault's ``transition.completed`` downtime, and each one over 2 s
is explained (:mod:`bench.chaos_slow`). Prints tables, then one JSON line. The stack's data
directory (logs in ``stack/logs``) is kept for a post-mortem.

    python bench/chaos.py [--seed 0] [--faults 50] [--jobs 3] [--quick] [--ha] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from unicron.cli.stack import Stack, StackConfig
from unicron.shared.procs import free_port

from bench.chaos_audit import audit, read_events
from bench.chaos_drive import JOB_END_TIMEOUT_S, TERMINAL, ChaosDriver
from bench.chaos_exact import Exactness, compare
from bench.chaos_kills import ChaosKiller
from bench.chaos_plan import CONTROL_PLANE, WORLD, ChaosPlan, is_infra, make_plan
from bench.chaos_procs import StackProcess, orphan_workers, stack_processes
from bench.chaos_records import progress
from bench.chaos_report import ChaosResult, print_tables
from bench.harness import DRILL_ENV, percentile

EXIT_GRACE_S = 10.0  # after the stack stopped, for its processes to be gone
REFERENCE_ATTEMPTS = 2


def _assigned(jobs: dict[str, dict[str, Any]]) -> set[int]:
    """Pids of the live workers of jobs still running: they are not orphans (yet)."""
    return {
        int(w["pid"])
        for job in jobs.values()
        if job["state"] not in TERMINAL
        for w in job["workers"]
        if w["pid"] and w["state"] in ("LAUNCHING", "RUNNING")
    }


def _stack_pids(stack: Stack) -> set[int]:
    pids = {c.process.pid for c in stack.children.values() if c.process is not None}
    return pids | {s.process.pid for s in stack.servers}


async def _left_after_stop(data_dir: Path) -> list[StackProcess]:
    """Every process the stack started that is still alive once it stopped (after a short
    grace); a worker or spare among them is an orphan."""
    deadline = time.monotonic() + EXIT_GRACE_S
    while True:
        left = stack_processes(data_dir, exclude=set())
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.2)


async def _final_jobs(driver: ChaosDriver) -> dict[str, dict[str, Any]]:
    jobs = {}
    for job_id in driver.job_ids:
        response = await driver.call("GET", f"/v1/jobs/{job_id}")
        response.raise_for_status()
        jobs[job_id] = response.json()
    return jobs


async def failure_free(driver: ChaosDriver) -> dict[str, dict[str, Any]]:
    """Each workload's job run before any fault, side by side: the reference of exact
    semantics; one that failed by itself (no fault was injected) runs again, once. Returns
    each workload's final job record."""
    plan, found = driver.plan, {}
    workloads = sorted({plan.workload(lane) for lane in range(plan.lanes)})
    for _ in range(REFERENCE_ATTEMPTS):
        for workload, job in (await _side_by_side(driver, workloads)).items():
            found[workload] = job
            if job["state"] != "SUCCEEDED" or job["recoveries"]:
                driver.log.notes.append(
                    f"failure-free reference {workload} ({job['id']}) ended {job['state']} "
                    f"after {job['recoveries']} recoveries, with no fault injected"
                )
        workloads = [w for w, j in found.items() if j["state"] != "SUCCEEDED" or j["recoveries"]]
        if not workloads:
            break
    return found


async def _side_by_side(driver: ChaosDriver, workloads: list[str]) -> dict[str, dict[str, Any]]:
    ids = {}
    for workload in workloads:
        spec = driver.plan.spec(workload, f"reference-{workload}")
        response = await driver.call("POST", "/v1/jobs", json=spec)
        response.raise_for_status()
        ids[workload] = str(response.json()["id"])
    progress(f"failure-free references: {ids}")
    deadline = time.monotonic() + JOB_END_TIMEOUT_S
    while True:
        jobs = {w: (await driver.call("GET", f"/v1/jobs/{j}")).json() for w, j in ids.items()}
        if all(j["state"] in TERMINAL for j in jobs.values()) or time.monotonic() > deadline:
            return jobs
        await asyncio.sleep(0.5)


def _exactness(
    stack: Stack, driver: ChaosDriver, jobs: dict[str, Any], references: dict[str, Any]
) -> dict[str, Exactness]:
    found = {}
    checkpoints = stack.data_dir / "checkpoints"
    for job in driver.submitted:
        state, reference = jobs[job.job_id]["state"], references[job.workload]
        if state != "SUCCEEDED":
            found[job.job_id] = Exactness(None, False, 0, f"job {state}")
        elif reference["state"] != "SUCCEEDED":
            found[job.job_id] = Exactness(None, False, 0, f"reference {reference['state']}")
        else:
            want = checkpoints / reference["id"]
            found[job.job_id] = compare(checkpoints / job.job_id, want, driver.plan.steps)
    return found


async def chaos(plan: ChaosPlan, data_dir: Path) -> ChaosResult:
    started = time.monotonic()
    config = StackConfig(
        nodes=plan.nodes, slots=WORLD, api_port=free_port(), data_dir=data_dir / "stack",
        log_level="INFO", extra_env=dict(DRILL_ENV), ha=plan.ha,
    )  # fmt: skip
    stack = Stack(config)
    try:
        await asyncio.to_thread(stack.start)
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as api:
            driver = ChaosDriver(stack, api, plan)
            references = await failure_free(driver)
            killer = ChaosKiller(driver)
            supervisor = asyncio.create_task(killer.supervise())
            try:
                await driver.run()
            finally:
                killer.stop()
                await supervisor
            jobs = await _final_jobs(driver)
            ever = set(driver.log.worker_pids)
            running = stack_processes(stack.data_dir, exclude=_stack_pids(stack))
            orphans = orphan_workers(running, ever, _assigned(jobs))
            events = await read_events(api)
    finally:
        await asyncio.to_thread(stack.stop)
    left = await _left_after_stop(stack.data_dir)
    orphans += [p for p in left if (p.spare or p.job_id or p.pid in ever) and p not in orphans]
    exactness = _exactness(stack, driver, jobs, references)
    return ChaosResult(
        plan, driver.log, audit(events, driver.log.injections, driver.log.actions),
        driver.submitted, jobs, exactness, orphans, stack.data_dir, time.monotonic() - started,
    )  # fmt: skip


def summary(result: ChaosResult) -> dict[str, Any]:
    a, log, jobs = result.audit, result.log, result.jobs
    targets = [r.plan.target for r in log.actions]
    recoveries = a.recoveries()
    return {
        "faults": len(log.injections),
        "faults_planned": len(result.plan.faults),
        "service_kills": sum(t in CONTROL_PLANE or t.startswith("agent-") for t in targets),
        "agent_kills": sum(t.startswith("agent-") for t in targets),
        "infra_restarts": sum(is_infra(t) for t in targets),
        "jobs": len(jobs),
        "jobs_succeeded": sum(j["state"] == "SUCCEEDED" for j in jobs.values()),
        "jobs_stuck": sum(j["state"] not in TERMINAL for j in jobs.values()),
        "missed_failures": a.missed,
        "duplicate_failures": a.duplicates,
        "unexplained_failures": len(a.unexplained),
        "false_node_losses": len(a.false_node_losses),
        "false_node_loss_failures": len(a.false_loss_failures),
        "misattributed_failures": sum(o.misattributed for o in a.outcomes),
        "orphan_workers": len(result.orphans),
        "exact_semantics": bool(jobs) and all(e.exact for e in result.exactness.values()),
        "recovery_p50_s": _figure(percentile(recoveries, 50)),
        "recovery_p99_s": _figure(percentile(recoveries, 99)),
        "recovery_max_s": _figure(max(recoveries, default=None)),
        "recovery_p99_during_kill_s": _figure(percentile(a.recoveries(overlapped=True), 99)),
        "recovery_p99_outside_kills_s": _figure(percentile(a.recoveries(overlapped=False), 99)),
        "recoveries_over_2s": sum(r > 2.0 for r in recoveries),
        "unrecovered_faults": sum(r == math.inf for r in recoveries),
        "node_loss_recovery_max_s": _figure(max(a.agent_recoveries, default=None)),
        "faults_without_spare": sum(not i.warm for i in log.injections),
        "unexpected_exits": len(log.unexpected_exits),
        "ha": result.plan.ha,
        "seed": result.plan.seed,
        "wall_s": round(result.wall_s, 1),
        "data_dir": str(result.data_dir),
    }


def _figure(seconds: float | None) -> float | None:
    """Seconds for the JSON line: None where there was nothing to measure (NaN) or where a
    fault was never recovered from (infinite; JSON has no infinity)."""
    if seconds is None or seconds != seconds or seconds == math.inf:
        return None
    return round(seconds, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--faults", type=int, default=None, help="default 50 (4 with --quick)")
    parser.add_argument(
        "--jobs", type=int, default=None,
        help="jobs running at once, one 2-slot node each (default 3, 2 with --quick)",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true",
        help="a short run: a few faults, one control-plane kill, one Redis restart, no agent kill",
    )  # fmt: skip
    parser.add_argument(
        "--ha", action="store_true",
        help="on unicron up --ha's servers: kill one NATS server of three and fail Redis over "
        "(kill its primary) instead of restarting the single servers",
    )  # fmt: skip
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a new temp dir")
    args = parser.parse_args()
    faults = args.faults if args.faults is not None else 4 if args.quick else 50
    jobs = args.jobs if args.jobs is not None else 2 if args.quick else 3
    if faults < 1 or not 1 <= jobs <= 16:
        parser.error("--faults must be at least 1 and --jobs between 1 and 16")
    plan = make_plan(args.seed, faults, jobs, args.quick, args.ha)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="unicron-chaos-"))
    result = asyncio.run(chaos(plan, data_dir.resolve()))
    print_tables(result)
    print(json.dumps(summary(result)))


if __name__ == "__main__":
    main()
