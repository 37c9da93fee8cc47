"""Detector settings (``UNICRON_*`` environment variables)."""

from __future__ import annotations

from pydantic import Field
from unicron.shared.settings import CommonSettings


class DetectorSettings(CommonSettings):
    metrics_port: int = Field(9101, ge=0, le=65535)  # /metrics (0: off)
    correlation_window_s: float = 0.15
    node_check_interval_s: float = 0.1
    reconcile_interval_s: float = 2.0
    # How long an agent has to answer a question the detector asks it (request/reply).
    ping_timeout_s: float = 0.25
    # A silent node is judged lost only when corroborated (unicron.services.detector.suspicion):
    # while more than two nodes, and this share of those in service, are silent together and
    # unanswered, the observer is the likely fault (Kubernetes' unhealthy-zone threshold) ...
    mass_silence_share: float = Field(0.55, gt=0, le=1)
    # ... and no doubt of the observer's own hearing holds a verdict longer than this past the
    # node's deadline.
    suspicion_hold_s: float = Field(30.0, ge=0)
    # Extra wait for the hung rank's own report after its peers' (see liveness.hold).
    hang_grace_s: float = 0.5
    # Extra wait for the report of the rank whose peers parked after it broke their collective.
    park_grace_s: float = 2.0
    # How long the ranks of a plain script may take to all exit or report, while only peer
    # errors and unexplained exits are in (see liveness.Liveness).
    root_cause_wait_s: float = 10.0
    # A failure of the generation that recovered from another within this window escalates,
    # unless that generation had trained this many steps since (its recovery worked).
    escalation_window_s: float = 300.0
    escalation_steps: int = 10
    # This many node-attributable failures within the window quarantine the node.
    quarantine_threshold: int = 3
    quarantine_window_s: float = 600.0
    quarantine_cooldown_s: float = 600.0
    # Straggler: a rank whose median compute time is this many times its peers', for
    # ``straggler_patience`` evaluations in a row, over a window of recent steps.
    straggler_ratio: float = 1.5
    # An absolute floor too: on a shared, overloaded host millisecond steps drift apart.
    straggler_min_excess_s: float = 0.01
    straggler_window: int = 10
    straggler_patience: int = 8
