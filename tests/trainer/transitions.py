"""The test as agent and executor of one job: spawns workers and spares, sends regroup, fault
and launch directives to processes by pid, and collects what they report."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from unicron.shared.contracts.messages import FaultKind, FaultSpec, RegroupDirective
from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.workerchannel import (
    FaultDirective,
    ScriptLaunch,
    SpareLaunch,
    WorkerEnv,
    WorkerLaunch,
    env_name,
)

from tests.trainer.harness import REPO, AgentStandIn, agent_and_held_store, make_launch, spawn

Report = dict[str, Any]


class Executor:
    """Plays the control plane for one job against the stand-in agent."""

    def __init__(
        self, agent: AgentStandIn, spec: JobSpec, host: str, port: int, checkpoint_dir: Path
    ) -> None:
        self.agent = agent
        self.spec = spec
        self.host = host
        self.port = port
        self.checkpoint_dir = checkpoint_dir
        self.reports: list[Report] = []
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.members: dict[int, int] = {}  # rank of the current generation -> pid
        self.stderr: dict[int, str] = {}

    def launch(
        self, generation: int, rank: int, world: int, source: int | None = None
    ) -> WorkerLaunch:
        base = make_launch(
            self.spec, self.rendezvous(generation), self.agent, self.checkpoint_dir, rank, world
        )
        return base.model_copy(update={"generation": generation, "state_source_rank": source})

    def rendezvous(self, generation: int) -> Any:
        from unicron.shared.contracts.messages import Rendezvous

        return Rendezvous(host=self.host, port=self.port, prefix=f"job-t/gen-{generation}/")

    def start(
        self, launch: WorkerLaunch | None, module: str = "unicron.trainer.worker", **env: str
    ) -> int:
        proc = spawn(launch, module, **env)
        self.procs[proc.pid] = proc
        return proc.pid

    def start_spare(self) -> int:
        spare = WorkerEnv(spare=True, agent_socket=self.agent.path).to_environ()
        return self.start(None, "unicron.trainer.spare", **spare)

    def use_spare(self, pid: int, launch: WorkerLaunch) -> None:
        """Send what an agent sends: the launch and the reference trainer's process, named."""
        env = {k: v for k, v in os.environ.items() if k != env_name("launch")}
        env.update(WorkerEnv(launch=launch).to_environ())
        argv = [sys.executable, "-m", "unicron.trainer.worker"]
        script = ScriptLaunch(argv=argv, env=env, cwd=str(REPO))
        self.agent.send_to_pid(
            SpareLaunch(launch=launch, script=script).model_dump(mode="json"), pid
        )

    def regroup(
        self, generation: int, moves: dict[int, int], world: int, source: int | None = None
    ) -> None:
        """Send each current ``old rank -> new rank`` of ``moves`` its directive."""
        for old, new in moves.items():
            directive = RegroupDirective(
                job_id="job-t",
                generation=generation,
                rank=new,
                world_size=world,
                rendezvous=self.rendezvous(generation),
                state_source_rank=source,
            )
            self.agent.send_to_pid(directive.model_dump(mode="json"), self.members[old])

    def crash(self, rank: int, at_step: int) -> None:
        fault = FaultSpec(rank=rank, kind=FaultKind.CRASH, at_step=at_step)
        self.agent.send_to_pid(
            FaultDirective(fault=fault).model_dump(mode="json"), self.members[rank]
        )

    def until(self, done: Callable[[list[Report]], bool], timeout_s: float = 60.0) -> None:
        """Collect reports until ``done(all reports so far)``; fails the test on timeout."""
        deadline = time.monotonic() + timeout_s
        while not done(self.reports):
            left = deadline - time.monotonic()
            try:
                self.reports.append(self.agent.lines.get(timeout=max(left, 0.001)))
            except queue.Empty:
                raise AssertionError(f"timed out; last reports {self.reports[-8:]}") from None

    def of(self, kind: str, generation: int | None = None) -> list[Report]:
        return [
            r
            for r in self.reports
            if r["kind"] == kind and (generation is None or r["generation"] == generation)
        ]

    def latest_step(self) -> int:
        return max((r["step"] for r in self.of("step_completed")), default=0)

    def regrouped(self, generation: int, world: int) -> dict[int, Report]:
        """Wait for every rank of ``generation`` to report it regrouped; by rank."""
        self.until(lambda _: len(self.of("worker_regrouped", generation)) == world)
        found = {r["rank"]: r for r in self.of("worker_regrouped", generation)}
        self.members = {rank: r["pid"] for rank, r in found.items()}
        return found

    def failed(self, generation: int, ranks: set[int]) -> None:
        """Wait for the exceptions the survivors of ``generation`` report when peers die; each
        says the rank parked (it stays for a regroup), which is what makes a reattempt possible."""
        self.until(lambda _: {r["rank"] for r in self.of("worker_exception", generation)} >= ranks)
        reports = [r for r in self.of("worker_exception", generation) if r["rank"] in ranks]
        assert all(r["parked"] for r in reports), reports

    def finish(self, pids: list[int], timeout_s: float = 60.0) -> list[int | None]:
        """Exit codes of ``pids`` once they end (their stderr is kept in ``self.stderr``)."""
        codes: list[int | None] = []
        for pid in pids:
            proc = self.procs[pid]
            _, err = proc.communicate(timeout=timeout_s)
            self.stderr[pid] = err.decode(errors="replace")
            codes.append(proc.returncode)
        return codes

    def close(self) -> str:
        """Kill what still runs; every process's stderr, for a failing test to print."""
        for pid, proc in self.procs.items():
            if proc.returncode is None:
                proc.kill()
                _, err = proc.communicate(timeout=30)
                self.stderr[pid] = err.decode(errors="replace")
        return "\n".join(f"--- pid {pid}\n{err}" for pid, err in self.stderr.items())


@contextmanager
def executor(spec: JobSpec) -> Iterator[tuple[Executor, object]]:
    """An executor over a stand-in agent and a store held by the test; on failure it prints
    every worker's log."""
    with agent_and_held_store() as (agent, rendezvous, scratch, store):
        ex = Executor(agent, spec, rendezvous.host, rendezvous.port, scratch / "ck")
        try:
            yield ex, store
        except BaseException:
            print(ex.close())  # every worker's log, to see why
            raise
        ex.close()
