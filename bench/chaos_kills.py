"""The kills and restarts of a chaos run: kill -9 of a stack child or embedded server at its
planned moment after its fault, then ``Stack.restart_exited`` (Redis and NATS come back on the
same port and data directory, with their data). A process of the stack that exits without
the plan killing it is recorded — a finding — and started again, as ``unicron up`` would.

With ``--ha``, the Redis target is whichever server is primary at that moment, and it comes
back only after the Sentinels promoted its replica, as that replica's replica
(shared/servers/redisha.py).
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import time
from datetime import datetime
from pathlib import Path

import httpx
from unicron.cli.stack import LEASED_ROLES

from bench.chaos_drive import OUTAGE_TIMEOUT_S, POLL_S, RECOVERY_TIMEOUT_S, ChaosDriver
from bench.chaos_plan import REDIS_PRIMARY, ActionPlan, is_infra
from bench.chaos_records import ActionRecord, Injection, progress

SUPERVISE_S = 0.5  # how often ``unicron up`` looks for exited children
LOG_TAIL_BYTES = 256 * 1024
STARTED = "service started"  # shared/service.py, once connected to NATS and Redis
# What a process logs once it serves again, where that is later than its start: the planner
# waits for the dead instance's lease to lapse, an agent registers its node again.
SERVING = {"planner": "planner active", "executor": "executor active", "agent": "agent ready"}


def last_logged(log: Path, line_says: str) -> float | None:
    """When the service writing ``log`` last logged ``line_says``; None if it never did."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line_says in line:
            try:
                return datetime.fromisoformat(line.split(" ", 1)[0]).timestamp()
            except ValueError:
                continue
    return None


def started_since(log: Path, since: float, line_says: str = STARTED) -> bool:
    """Whether the service writing ``log`` logged ``line_says`` at or after ``since``."""
    at = last_logged(log, line_says)
    return at is not None and at >= since


class ChaosKiller:
    def __init__(self, driver: ChaosDriver) -> None:
        self.driver = driver
        self.stack = driver.stack
        self.log = driver.log
        self.lock = asyncio.Lock()  # one action (or unplanned restart) at a time
        self.down: set[str] = set()  # what the plan holds down now
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        driver.injection_hooks.append(self.schedule)
        driver.finish_hooks.append(self.finish)

    def schedule(self, injection: Injection) -> None:
        """Start the actions planned after ``injection``'s fault."""
        fault = injection.fault
        for action in self.driver.plan.actions:
            if (action.lane, action.order) == (fault.lane, fault.order):
                self._tasks.append(asyncio.create_task(self.act(action, injection)))

    async def finish(self) -> None:
        await asyncio.gather(*self._tasks)

    def _process(self, target: str) -> tuple[str, subprocess.Popen[bytes]]:
        """The process ``target`` names now, and its name in the stack."""
        if target == REDIS_PRIMARY:
            assert self.stack.redis_ha is not None, "a Redis failover needs --ha"
            primary = self.stack.redis_ha.primary()
            assert primary is not None, "the Sentinels name no primary"
            return primary.name, primary.process
        for server in self.stack.servers:
            if server.name == target:
                return server.name, server.process
        if target in LEASED_ROLES:  # with --ha, the instance holding the role's lease
            target = max(self.stack.instances(target), key=self._activated)
        process = self.stack.children[target].process
        assert process is not None  # every child is started with the stack
        return target, process

    async def act(self, action: ActionPlan, after: Injection) -> None:
        await asyncio.sleep(max(0.0, after.at + action.delay_s - time.time()))
        driver = self.driver
        async with self.lock:
            if action.quiet:
                driver.gate.clear()
                await driver.until(lambda: driver.in_flight == 0, RECOVERY_TIMEOUT_S)
            # No fault is posted while the API cannot answer because of the bench itself: its
            # answer could be lost and the fault's fate unknown.
            holds_api = action.target == "api" or is_infra(action.target)
            if holds_api:
                await driver.api_lock.acquire()
            try:
                await self._kill_and_restart(action)
            finally:
                if holds_api:
                    driver.api_lock.release()
                driver.gate.set()

    async def _kill_and_restart(self, action: ActionPlan) -> None:
        name, proc = self._process(action.target)
        self.down.add(name)
        killed_at = time.time()
        proc.kill()
        progress(f"kill -9 {name} (down {action.down_s:.2f} s)")
        await asyncio.to_thread(proc.wait)
        await asyncio.sleep(action.down_s)
        if action.target == REDIS_PRIMARY:
            await self._promoted(name)
        restarted = await asyncio.to_thread(self.stack.restart_exited)
        self.down.discard(name)
        record = ActionRecord(action, killed_at, time.time(), None)
        record.also_restarted = [n for n in restarted if n != name]
        self.log.unexpected_exits += [
            f"{n} (seen at a planned kill)" for n in record.also_restarted
        ]
        self.log.actions.append(record)
        if await self._back(action, killed_at):
            record.back_at = time.time()

    async def _back(self, action: ActionPlan, since: float) -> bool:
        """Wait until the API is ready again and a killed service or agent says it serves
        again (faults go only to whole jobs, so the gate may open before the node's jobs
        have recovered)."""
        driver = self.driver
        deadline = time.monotonic() + OUTAGE_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                ready = (await driver.api.get("/readyz", timeout=0.5)).status_code == 200
            except httpx.TransportError:
                ready = False
            if not is_infra(action.target):
                ready = ready and self._serving(action.target, since)
            if ready:
                return True
            await asyncio.sleep(POLL_S)
        return False

    def _log(self, name: str) -> Path:
        return self.stack.data_dir / "logs" / f"{name}.log"

    def _activated(self, name: str) -> float:
        """When the process ``name`` of a leased role last became its active instance."""
        role = name.split("-")[0]
        return last_logged(self._log(name), SERVING[role]) or -math.inf

    def _serving(self, target: str, since: float) -> bool:
        """Whether ``target`` serves again since ``since``: for a leased role, any of its
        instances (a standby taking over is the role back)."""
        role = target.split("-")[0]
        names = self.stack.instances(role) if role in LEASED_ROLES else [target]
        line = SERVING.get(role, STARTED)
        return any(started_since(self._log(name), since, line) for name in names)

    async def _promoted(self, name: str) -> None:
        """Wait until the Sentinels promoted a replica in place of the killed ``name``."""
        ha = self.stack.redis_ha
        assert ha is not None
        port = next(s.port for s in ha.data if s.name == name)
        new = await asyncio.to_thread(ha.wait_promoted, port, OUTAGE_TIMEOUT_S)
        progress(f"redis failover: the primary is now on port {new}")

    async def supervise(self) -> None:
        """Until ``stop``: start again what exits without the plan killing it, and record it."""
        while not self._stop.is_set():
            await asyncio.sleep(SUPERVISE_S)
            exited = [
                name
                for name, proc in self._processes()
                if name not in self.down and proc.poll() is not None
            ]
            if not exited:
                continue
            async with self.lock:
                stamp = time.strftime("%H:%M:%S")
                self.log.unexpected_exits += [f"{n} at {stamp}" for n in exited]
                await asyncio.to_thread(self.stack.restart_exited)

    def stop(self) -> None:
        self._stop.set()

    def _processes(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        found = [(s.name, s.process) for s in self.stack.servers]
        found += [(c.name, c.process) for c in self.stack.children.values() if c.process]
        return found
