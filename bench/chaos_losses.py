"""Node losses the chaos bench did not cause: the detector declared a node lost (``node.lost``,
then a ``node_lost`` failure for each job on it) although the bench never killed that node's
agent around its last heartbeat. The control plane blipped instead (a kill -9 of Redis, NATS
or a service) and the node's heartbeats went unheard for too long.

Such a failure is a finding of its own, not a duplicate of the fault its job was recovering
from; each is named with the kill it followed, so that a reader sees what caused it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bench.chaos_records import ActionRecord

Event = dict[str, Any]
NODE_LOST_KIND = "node_lost"  # FailureKind.NODE_LOST, as the event stream spells it
# A killed agent's node last beat at most this long before the kill (the heartbeat interval
# is 1 s, and a beat may wait on a busy machine).
HEARTBEAT_SLACK_S = 5.0


@dataclass(frozen=True)
class FalseNodeLoss:
    node_id: str
    last_heartbeat: float
    declared_at: float
    failure: Event | None  # the failure.detected data of one job; None for the node.lost event
    after: ActionRecord | None  # the nearest kill before the loss was declared

    @property
    def kill_lead_s(self) -> float | None:
        """How long before the loss was declared the kill it followed struck."""
        return None if self.after is None else self.declared_at - self.after.killed_at


def agent_killed_at(node_id: str, last_heartbeat: float, actions: list[ActionRecord]) -> bool:
    """Whether the bench killed ``node_id``'s agent at its ``last_heartbeat``: shortly after
    that beat, and before the restarted agent could beat again."""
    agent = f"agent-{node_id}"
    return any(
        a.plan.target == agent
        and a.killed_at - HEARTBEAT_SLACK_S <= last_heartbeat <= a.restarted_at
        for a in actions
    )


def _false_loss(
    node_id: str | None,
    last_heartbeat: float,
    declared_at: float,
    failure: Event | None,
    actions: list[ActionRecord],
) -> FalseNodeLoss | None:
    if node_id is None or agent_killed_at(node_id, last_heartbeat, actions):
        return None
    before = [a for a in actions if a.killed_at <= declared_at]
    nearest = max(before, key=lambda a: a.killed_at, default=None)
    return FalseNodeLoss(node_id, last_heartbeat, declared_at, failure, nearest)


def false_loss_event(event: Event, actions: list[ActionRecord]) -> FalseNodeLoss | None:
    """The ``node.lost`` ``event`` (the whole CloudEvent) as a false node loss, if it is one;
    it was declared at the envelope's time."""
    data = event["data"]
    stamp = event.get("time")
    declared = datetime.fromisoformat(stamp).timestamp() if stamp else data["last_heartbeat"]
    return _false_loss(data["node_id"], data["last_heartbeat"], declared, None, actions)


def false_loss_failure(failure: Event, actions: list[ActionRecord]) -> FalseNodeLoss | None:
    """The failure.detected data ``failure`` as a false node loss, if it is one: its observed
    time is the node's last heartbeat (services/detector/nodes.py)."""
    if failure["kind"] != NODE_LOST_KIND:
        return None
    at = float(failure["observed_at"])
    declared = float(failure.get("detected_at", at))
    return _false_loss(failure.get("node_id"), at, declared, failure, actions)
