"""Why a chaos run's slow recoveries were slow: for each fault recovered from in more than
``SLOW_S``, the phases of the transition that ended it (``transition.completed``, timed by
services/executor/completion.py) and what the recovery waited on: no warm spare, a kill -9
during it, a false node loss, a further failure, a fallback or restart from a checkpoint, the
planner."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.chaos_audit import FaultOutcome
from bench.chaos_losses import Event

SLOW_S = 2.0  # the recovery goal of issue 11
# The phases that follow one another within a downtime; state_transfer happens within regroup
# (a worker reports its regroup once its state arrived).
SEQUENTIAL_PHASES = ("detect", "plan", "regroup", "first_step")
# The part of the downtime no phase times: between the plan and the executor starting the
# transition, or all of it where the executor could time no phase.
UNPHASED = "unphased"
# What each phase waits on, for the reader of the table.
PHASE_WAITS_ON = {
    "detect": "the detector",
    "plan": "the planner",
    "regroup": "workers regrouping",
    "state_transfer": "the state transfer",
    "first_step": "the first step",
    UNPHASED: "the executor starting the plan",
}


@dataclass(frozen=True)
class SlowRecovery:
    outcome: FaultOutcome
    phases: dict[str, float]  # the transition's, and the UNPHASED rest of its downtime
    waited_on: list[str]

    @property
    def longest_phase(self) -> str | None:
        return longest_phase(self.phases)


def longest_phase(phases: dict[str, float]) -> str | None:
    """The phase that took the most of the downtime (state_transfer is part of regroup)."""
    sequential = {k: v for k, v in phases.items() if k != "state_transfer"}
    return max(sequential, key=lambda k: sequential[k], default=None)


def phases_of(transition: Event | None) -> dict[str, float]:
    """The phases of a ``transition.completed`` event's data, with the UNPHASED rest of its
    downtime."""
    if transition is None:
        return {}
    phases = {k: float(v) for k, v in (transition.get("phases") or {}).items()}
    downtime = transition.get("downtime_s")
    if downtime is not None:
        timed = sum(phases.get(name, 0.0) for name in SEQUENTIAL_PHASES)
        phases[UNPHASED] = round(max(0.0, downtime - timed), 4)
    return phases


def _kill_waits(outcome: FaultOutcome) -> list[str]:
    start = outcome.interruptions[0]["observed_at"]
    return [
        f"{kill.plan.target} kill -9 at {kill.killed_at - start:+.1f} s" for kill in outcome.kills
    ]


def _failure_waits(outcome: FaultOutcome) -> list[str]:
    waits = [f"{len(outcome.failures) - 1} more failures"] if len(outcome.failures) > 1 else []
    for loss in outcome.false_losses:
        after = f" after {loss.after.plan.target}" if loss.after else ""
        waits.append(f"false loss of {loss.node_id}{after}")
    return waits


def _transition_waits(outcome: FaultOutcome, longest: str | None) -> list[str]:
    done = outcome.transition
    if done is None:
        return ["never recovered"] if outcome.recovered_in == math.inf else []
    waits = [f"fallback: {done['fallback']}"] if done.get("fallback") else []
    if done.get("kind") == "checkpoint":
        waits.append(f"checkpoint restart (state: {done.get('state_source') or '-'})")
    if longest is not None:
        waits.append(f"mostly {PHASE_WAITS_ON.get(longest, longest)}")
    return waits


def explain(outcome: FaultOutcome) -> SlowRecovery:
    """What ``outcome``'s recovery (one with failures) consisted of and waited on."""
    phases = phases_of(outcome.transition)
    waits = [] if outcome.injection.warm else ["no warm spare"]
    waits += _kill_waits(outcome) + _failure_waits(outcome)
    waits += _transition_waits(outcome, longest_phase(phases))
    return SlowRecovery(outcome, phases, waits)


def slow_recoveries(outcomes: list[FaultOutcome], over_s: float = SLOW_S) -> list[SlowRecovery]:
    """Each recovery longer than ``over_s`` (a never-ending one too), explained, slowest
    first."""
    slow = [o for o in outcomes if o.recovered_in is not None and o.recovered_in > over_s]
    return [explain(o) for o in sorted(slow, key=lambda o: -(o.recovered_in or 0.0))]
