"""What a chaos run's event stream says about each injected fault: the failures it caused and
the recovery that followed.

The events are read after the run, from the start of the stream (``GET /v1/events?follow=
false``), de-duplicated by CloudEvent id: a restarted service that publishes an event again
publishes it with the same id (docs/design.md §6), so a replay is not counted twice, while a
second failure for one fault has its own id. A failure belongs to

1. the fault whose id the detector put in its ``evidence["drill"]`` (the API marks the drilled
   generation before sending the fault);
2. else the agent kill whose outage it falls in (no fault is in flight when an agent is killed:
   the bench waits for that);
3. else the job's latest fault injected before it, if the job had not recovered from that
   fault yet: a second failure for one fault (e.g. the recovery itself failing) is a
   duplicate;
4. else nothing: unexplained (a false alarm, or a failure the bench did not cause).

A ``node_lost`` failure of a node whose agent the bench did not kill is a false node loss
(:mod:`bench.chaos_losses`), never a duplicate nor unexplained; if it struck a job recovering
from a fault, that recovery lasts until the job recovered from the loss too.

Advisory failures (``action: report``, stragglers) need no recovery and are only counted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import httpx

from bench.chaos_losses import (
    HEARTBEAT_SLACK_S,
    Event,
    FalseNodeLoss,
    false_loss_event,
    false_loss_failure,
)
from bench.chaos_plan import is_infra
from bench.chaos_records import ActionRecord, Injection

# The failure kind each injected fault must be recorded as.
EXPECTED_KIND = {"crash": "crash", "exit": "exit", "exception": "exception", "hang": "hang"}
# Failures this long after a killed agent served again are still its: its node's jobs may
# still be recovering, and no fault was injected into them meanwhile (they were not whole).
AGENT_GRACE_S = 60.0
# The API answering again after a server restart does not mean every client has reconnected
# (each backs off on its own): the outage's reach is counted this much longer.
RECONNECT_TAIL_S = 5.0
# A failure this long after the bench saw the job whole again is a new one, not the fault's.
RECOVERED_GRACE_S = 2.0


async def read_events(api: httpx.AsyncClient, timeout_s: float = 120.0) -> list[Event]:
    """Every stored event, in stream order."""
    events = []
    async with api.stream("GET", "/v1/events", params={"follow": "false"}, timeout=timeout_s) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[len("data:") :]))
    return events


@dataclass
class FaultOutcome:
    injection: Injection
    failures: list[Event] = field(default_factory=list)  # failure.detected data, in time order
    recovery_s: float | None = None
    false_losses: list[FalseNodeLoss] = field(default_factory=list)  # of its job, meanwhile
    transition: Event | None = None  # the transition.completed data that ended the recovery
    kills: list[ActionRecord] = field(default_factory=list)  # kills/restarts during the recovery

    @property
    def overlapping(self) -> list[str]:
        return [k.plan.target for k in self.kills]

    @property
    def interruptions(self) -> list[Event]:
        """Every failure its job's recovery answered, false node losses included, in time
        order."""
        lost = [loss.failure for loss in self.false_losses if loss.failure is not None]
        return sorted(self.failures + lost, key=lambda f: f["observed_at"])

    @property
    def recovered_in(self) -> float | None:
        """Seconds to recover; infinite for a detected fault never recovered from, None for a
        missed one (it has no recovery to time)."""
        if not self.failures:
            return None
        return math.inf if self.recovery_s is None else self.recovery_s

    @property
    def misattributed(self) -> bool:
        """The failure names another rank or kind than the fault that caused it."""
        if not self.failures:
            return False
        first, fault = self.failures[0], self.injection.fault
        return bool(first["rank"] != fault.rank or first["kind"] != EXPECTED_KIND[fault.kind.value])


@dataclass
class Audit:
    outcomes: list[FaultOutcome]
    agent_failures: list[Event]
    agent_recoveries: list[float]
    unexplained: list[Event]
    advisory: int
    false_node_losses: list[FalseNodeLoss] = field(default_factory=list)  # node.lost events
    false_loss_failures: list[FalseNodeLoss] = field(default_factory=list)  # their failures

    @property
    def missed(self) -> int:
        return sum(not o.failures for o in self.outcomes)

    @property
    def duplicates(self) -> int:
        return sum(max(0, len(o.failures) - 1) for o in self.outcomes)

    def recoveries(self, overlapped: bool | None = None) -> list[float]:
        """Each detected fault's recovery time (infinite when it never recovered)."""
        return [
            o.recovered_in
            for o in self.outcomes
            if o.recovered_in is not None
            and (overlapped is None or bool(o.overlapping) == overlapped)
        ]


def _agent_window(failure: Event, actions: list[ActionRecord]) -> bool:
    """Whether ``failure`` belongs to an agent kill: seen during its outage, or a loss of its
    node (observed at the node's last heartbeat, just before the kill)."""
    at = failure["observed_at"]
    for action in actions:
        if not action.plan.quiet:
            continue
        start = action.killed_at
        if failure.get("node_id") == action.plan.target.removeprefix("agent-"):
            start -= HEARTBEAT_SLACK_S
        end = (action.back_at or action.restarted_at + 60.0) + AGENT_GRACE_S
        if start <= at <= end:
            return True
    return False


def _owner(
    failure: Event, injections: list[Injection], actions: list[ActionRecord]
) -> Injection | str:
    drill = (failure.get("evidence") or {}).get("drill")
    for injection in injections:
        if drill is not None and injection.fault_id == drill:
            return injection
    if _agent_window(failure, actions):
        return "agent"
    at = failure["observed_at"]
    earlier = [i for i in injections if i.job_id == failure["job_id"] and i.at <= at]
    latest = max(earlier, key=lambda i: i.at, default=None)
    if latest is None or (latest.recovered_at or at) + RECOVERED_GRACE_S < at:
        return "unexplained"
    return latest


def recovery_after(
    failures: list[Event], transitions: list[Event]
) -> tuple[Event | None, float | None]:
    """The first recovery transition after the last of ``failures`` (one job's, in time
    order) and the time from the first failure to it: the transition's downtime counts from
    the failure the executor recovered from, the last one."""
    first, last = failures[0], failures[-1]
    after = [
        t
        for t in transitions
        if t["job_id"] == first["job_id"]
        and t["generation"] > last["generation"]
        and t.get("downtime_s") is not None
    ]
    if not after:
        return None, None
    done = min(after, key=lambda t: t["generation"])
    return done, float(done["downtime_s"]) + last["observed_at"] - first["observed_at"]


def _overlaps(outcome: FaultOutcome, actions: list[ActionRecord]) -> list[ActionRecord]:
    if outcome.recovered_in is None:
        return []
    start = outcome.interruptions[0]["observed_at"]
    end = start + outcome.recovered_in
    found = []
    for a in actions:
        back = a.back_at or a.restarted_at
        if is_infra(a.plan.target):
            back += RECONNECT_TAIL_S
        if a.killed_at <= end and back >= start:
            found.append(a)
    return found


def _file(failure: Event, result: Audit, actions: list[ActionRecord]) -> None:
    """Count ``failure`` in ``result``: advisory, a false node loss (with the recovery it
    struck, if any), an agent kill's, a fault's, or unexplained."""
    if failure["action"] == "report":
        result.advisory += 1
        return
    owner = _owner(failure, [o.injection for o in result.outcomes], actions)
    outcome = next((o for o in result.outcomes if o.injection is owner), None)
    false_loss = false_loss_failure(failure, actions)
    if false_loss is not None:
        result.false_loss_failures.append(false_loss)
        if outcome is not None:
            outcome.false_losses.append(false_loss)
    elif outcome is not None:
        outcome.failures.append(failure)
    elif owner == "agent":
        result.agent_failures.append(failure)
    else:
        result.unexplained.append(failure)


def audit(events: list[Event], injections: list[Injection], actions: list[ActionRecord]) -> Audit:
    unique = list({e["id"]: e for e in events}.values())  # a replayed event counts once
    by_type: dict[str, list[Event]] = {}
    for event in unique:
        by_type.setdefault(event["type"], []).append(event["data"])
    result = Audit([FaultOutcome(i) for i in injections], [], [], [], 0)
    lost = [false_loss_event(e, actions) for e in unique if e["type"] == "node.lost"]
    result.false_node_losses = sorted(filter(None, lost), key=lambda loss: loss.declared_at)
    for failure in sorted(by_type.get("failure.detected", []), key=lambda f: f["observed_at"]):
        _file(failure, result, actions)
    transitions = by_type.get("transition.completed", [])
    for outcome in result.outcomes:
        if outcome.failures:
            outcome.transition, outcome.recovery_s = recovery_after(
                outcome.interruptions, transitions
            )
            outcome.kills = _overlaps(outcome, actions)
    for failure in result.agent_failures:
        _, seconds = recovery_after([failure], transitions)
        if seconds is not None:
            result.agent_recoveries.append(seconds)
    return result
