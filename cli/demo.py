"""``unicron demo``: the self-healing demo on an embedded stack it starts and stops itself.

Two node agents with two slots each (on a GPU host: one per GPU of each agent's share, see
``cli/gpushare.py``) run a GPT job on up to four workers; mid-training one worker is
killed with SIGKILL; the demo shows the failure, the plan, the restart and the job finishing,
then reports the measured detection and recovery times (kill → next completed step).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table
from unicron.cli.stack import Stack, StackConfig
from unicron.shared.procs import free_port

console = Console(highlight=False)
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@dataclass
class DemoRun:
    started: float = field(default_factory=time.time)
    killed_at: float | None = None
    killed_pid: int | None = None
    failure: dict[str, Any] | None = None
    completed: dict[str, Any] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def elapsed(self) -> str:
        return f"{time.time() - self.started:6.1f}s"


def _describe(event: dict[str, Any]) -> str:
    data, kind = event["data"], event["type"]
    if kind == "job.state_changed":
        return f"{data['old']} -> {data['new']}  ({data['reason']})"
    if kind == "failure.detected":
        return (
            f"rank {data['rank']} on {data['node_id']}: {data['kind']}/{data['category']} "
            f"{data['severity']} -> {data['action']}"
        )
    if kind == "plan.created":
        jobs = ", ".join(f"{j['action']} x{j['workers']}" for j in data["jobs"]) or "idle"
        return f"plan #{data['seq']}: {jobs}"
    if kind == "job.submitted":
        spec = data["spec"]
        return (
            f"{data['name']}: {spec['steps']} steps, "
            f"{spec['min_workers']}-{spec['max_workers']} workers"
        )
    if kind.startswith("transition."):
        keys = ("action", "generation", "to_workers", "world_size", "downtime_s", "resumed_step")
        return " ".join(f"{k}={data[k]}" for k in keys if k in data and data[k] is not None)
    if kind.startswith("node."):
        return f"{data['node_id']}"
    return json.dumps(data)[:120]


async def _follow_events(client: httpx.AsyncClient, run: DemoRun) -> None:
    async with client.stream("GET", "/v1/events", params={"since": 0}, timeout=None) as resp:
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            console.print(
                f"[dim]{run.elapsed()}[/dim] [cyan]{event['type']:<22}[/cyan] {_describe(event)}"
            )
            if event["type"] == "failure.detected" and run.killed_at is not None:
                run.failure = event["data"]
            if event["type"] == "transition.completed" and run.failure is not None:
                run.completed = event["data"]


async def _drive(
    client: httpx.AsyncClient, run: DemoRun, steps: int, kill_at: int
) -> dict[str, Any]:
    spec = {
        "name": "demo-gpt",
        "steps": steps,
        "min_workers": 2,
        "max_workers": 4,
        "global_batch": 16,
        "micro_batch": 4,
        "checkpoint_every": 20,
    }
    job = (await client.post("/v1/jobs", json=spec)).raise_for_status().json()
    console.print(f"[bold]submitted[/bold] {job['id']}: {steps} steps, up to 4 workers")
    last_shown = -1
    while True:
        job = (await client.get(f"/v1/jobs/{job['id']}")).raise_for_status().json()
        if job["step"] // 10 != last_shown // 10 and job["state"] == "RUNNING":
            last_shown = job["step"]
            loss = f"{job['loss']:.3f}" if job.get("loss") is not None else "-"
            console.print(
                f"[dim]{run.elapsed()}[/dim] step {job['step']:>4}/{steps}  loss {loss}"
                f"  workers {job['world_size']}"
            )
        if run.killed_at is None and job["state"] == "RUNNING" and job["step"] >= kill_at:
            victim = next(w for w in job["workers"] if w["rank"] == 1)
            os.kill(victim["pid"], signal.SIGKILL)
            run.killed_at, run.killed_pid = time.time(), victim["pid"]
            console.print(
                f"[bold red]{run.elapsed()} SIGKILL rank 1 (pid {victim['pid']}) "
                f"at step {job['step']}[/bold red]"
            )
        if job["state"] in TERMINAL:
            return dict(job)
        await asyncio.sleep(0.1)


def _summary(run: DemoRun, job: dict[str, Any]) -> Table:
    table = Table(title="Unicron demo")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("job state", job["state"])
    table.add_row("steps done", f"{job['step']} / {job['spec']['steps']}")
    table.add_row("recoveries", str(job["recoveries"]))
    if run.failure and run.killed_at:
        table.add_row(
            "detection (kill -> failure.detected)",
            f"{run.failure['detected_at'] - run.killed_at:.3f} s",
        )
    if run.completed and run.failure and run.killed_at:
        first_step = run.failure["observed_at"] + (run.completed["downtime_s"] or 0.0)
        table.add_row(
            "recovery (kill -> next completed step)", f"{first_step - run.killed_at:.2f} s"
        )
        table.add_row("resumed at step", str(run.completed["resumed_step"]))
    table.add_row("wall time", f"{time.time() - run.started:.1f} s")
    return table


async def _run_demo(stack: Stack, steps: int, kill_at: int, deadline_s: float) -> bool:
    run = DemoRun()
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as client:
        follower = asyncio.create_task(_follow_events(client, run))
        try:
            job = await asyncio.wait_for(_drive(client, run, steps, kill_at), deadline_s)
            await asyncio.sleep(0.3)  # let the last events print
        finally:
            follower.cancel()
    console.print(_summary(run, job))
    return bool(job["state"] == "SUCCEEDED" and job["step"] == steps)


def demo(
    steps: Annotated[int, typer.Option(min=20, help="training steps")] = 120,
    kill_at: Annotated[int, typer.Option(min=1, help="kill a worker at this step")] = 45,
    deadline_s: Annotated[float, typer.Option(help="give up after this many seconds")] = 170.0,
) -> None:
    """Start an embedded stack, train a GPT on 4 workers, kill one, watch it heal."""
    with tempfile.TemporaryDirectory(prefix="unicron-demo-") as tmp:
        # two slots an agent on CPU; on a GPU host one per GPU of the agent's share
        config = StackConfig(nodes=2, api_port=free_port(), data_dir=Path(tmp))
        console.print("[bold]starting NATS, Redis, api, detector, planner, executor, 2 agents…")
        try:
            with Stack(config) as stack:
                if stack.gpus.note:
                    console.print(stack.gpus.note)
                ok = asyncio.run(_run_demo(stack, steps, kill_at, deadline_s))
        except KeyboardInterrupt:
            console.print("interrupted; everything stopped")
            raise typer.Exit(130) from None
        except (TimeoutError, RuntimeError, httpx.HTTPError) as exc:
            console.print(f"[red]demo failed: {exc!r}[/red]")
            raise typer.Exit(1) from exc
    raise typer.Exit(0 if ok else 1)
