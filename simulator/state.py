"""What a policy acts on: each job's allocation and recovery, and the work it accrues.

A job is *up* when it holds workers and its recovery is over (``now ≥ down_until``); while up it
earns weight x T(workers) x the policy's overhead factor of WAF every second (docs/design.md §1).
Detection, planning, transition downtime and recomputation all hold the job down: a policy
calls :meth:`Simulation.hold` with their sum. Rates are constant between events, so the
accrual is exact. A job with a ``length_s`` finishes when its work (FLOPs of ``length_s`` on
``max_gpus``) is done; a FINISH event, versioned, is re-armed whenever its rate changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from unicron.simulator.cluster import ClusterState
from unicron.simulator.events import EventQueue, Kind
from unicron.simulator.inputs import ClusterConfig, JobConfig
from unicron.simulator.workload import Speeds


class Mechanism(Protocol):
    """What the accrual needs of a policy: each job's T(x) and what multiplies it. The runner
    drives the rest of :class:`unicron.simulator.policies.base.Policy`."""

    def speeds(self, job: JobConfig, config: ClusterConfig) -> Speeds: ...

    def throughput_factor(self, run: JobRun, workers: int) -> float: ...


@dataclass
class JobRun:
    config: JobConfig
    speeds: Speeds
    workers: int = 0
    flops: float = 0.0  # achieved model FLOP/s while up (T x the policy's overhead factor)
    down_until: float = 0.0
    arrived: bool = False
    done: bool = False
    work_left: float = math.inf
    last_t: float = 0.0
    version: int = 0
    acc_waf: float = 0.0  # weighted FLOPs done (∫ w·T dt)
    useful_s: float = 0.0
    down_s: float = 0.0
    wait_s: float = 0.0  # admitted, holding no GPUs
    first_run_s: float | None = None  # when it first held GPUs
    hits: int = 0
    memo: dict[str, Any] = field(default_factory=dict)  # the policy's own bookkeeping

    @property
    def name(self) -> str:
        return self.config.name

    def up(self, now: float) -> bool:
        return self.workers > 0 and now >= self.down_until and not self.done

    def accrue(self, t: float) -> None:
        span = t - self.last_t
        if span > 0 and self.arrived and not self.done:
            if self.workers == 0:
                self.wait_s += span
            else:
                start = min(max(self.down_until, self.last_t), t)
                up = t - start
                self.down_s += start - self.last_t
                self.useful_s += up
                self.acc_waf += self.config.weight * self.flops * up
                self.work_left -= self.flops * up
        self.last_t = max(self.last_t, t)


class Simulation:
    def __init__(self, config: ClusterConfig, jobs: list[JobConfig], policy: Mechanism) -> None:
        self.config, self.policy = config, policy
        self.cluster = ClusterState(config.nodes, config.gpus_per_node)
        self.queue = EventQueue()
        self.now = 0.0
        self.jobs = {j.name: JobRun(j, policy.speeds(j, config)) for j in jobs}
        for run in self.jobs.values():
            if run.config.length_s is not None:
                run.work_left = run.config.length_s * run.speeds.flops(run.config.max_gpus)

    def advance(self, t: float) -> None:
        for run in self.jobs.values():
            run.accrue(t)
        self.now = max(self.now, t)

    def active(self) -> list[JobRun]:
        """Jobs submitted and not finished, in submission order (arrival, then file order)."""
        runs = [r for r in self.jobs.values() if r.arrived and not r.done]
        return sorted(runs, key=lambda r: r.config.arrival_s)

    def set_workers(self, run: JobRun, workers: int) -> None:
        """The job now trains on ``workers`` (the cluster ledger is the caller's)."""
        run.workers = workers
        if workers and run.first_run_s is None:
            run.first_run_s = self.now
        run.flops = run.speeds.flops(workers) * self.policy.throughput_factor(run, workers)
        self._rearm(run)

    def hold(self, run: JobRun, seconds: float) -> None:
        """The job makes no progress for ``seconds`` from now (overlapping holds don't add)."""
        run.down_until = max(run.down_until, self.now + seconds)
        self._rearm(run)

    def wake(self, at: float, payload: Any) -> None:
        self.queue.push(at, Kind.WAKE, payload)

    def _rearm(self, run: JobRun) -> None:
        run.version += 1
        if math.isfinite(run.work_left) and run.flops > 0 and not run.done:
            start = max(self.now, run.down_until)
            self.queue.push(
                start + max(run.work_left, 0.0) / run.flops, Kind.FINISH, (run.name, run.version)
            )

    def finish(self, run: JobRun) -> None:
        run.done = True
        run.workers, run.flops = 0, 0.0
        self.cluster.release(run.name)
