"""What a chaos run did, as it did it: the faults it injected, the kills, what it noticed."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.chaos_plan import ActionPlan, FaultPlan


def progress(message: str) -> None:
    print(f"chaos {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


@dataclass
class Injection:
    fault: FaultPlan
    body: dict[str, Any]
    job_id: str
    fault_id: str | None  # None when the answer was lost but the fault did strike
    generation: int
    node_id: str | None
    at: float  # wall clock, comparable with the events' times
    step: int
    warm: bool = True  # its rank's node had a warm spare when it struck
    recovered_at: float | None = None


@dataclass
class ActionRecord:
    plan: ActionPlan
    killed_at: float
    restarted_at: float
    back_at: float | None  # the API ready and the killed process serving again
    also_restarted: list[str] = field(default_factory=list)


@dataclass
class ChaosLog:
    injections: list[Injection] = field(default_factory=list)
    actions: list[ActionRecord] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    worker_pids: dict[int, set[tuple[str, int, int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class SubmittedJob:
    lane: int
    workload: str
    job_id: str
