"""What the driver of ``bench/scale.py`` (``bench/scale_cluster.py``) and its fleets of simulated
agents (``bench/scale_fleet.py``) say to each other on core NATS, and the simulated nodes' names.

``FAULT_SUBJECT`` goes to every fleet (the owner of the node injects, the others report as
peers), ``REVIVE_SUBJECT`` boots a lost node again, and ``JOINED_SUBJECT`` carries the fleets'
counts of their joined ranks to each other. Per fleet, ``bench.scale.<index>.commands`` answers
with the ``Arrivals`` of a job's generations and ``bench.scale.<index>.status`` with its status.
"""

from __future__ import annotations

from dataclasses import dataclass

FAULT_SUBJECT = "bench.scale.fault"
REVIVE_SUBJECT = "bench.scale.revive"
JOINED_SUBJECT = "bench.scale.joined"


def node_name(index: int) -> str:
    return f"sim-{index:05d}"


@dataclass
class Arrivals:
    """When the commands of one generation reached a fleet: how many, the first and the last."""

    count: int = 0
    first: float = 0.0
    last: float = 0.0

    def add(self, at: float) -> None:
        self.first = self.first or at
        self.last, self.count = at, self.count + 1
