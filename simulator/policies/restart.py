"""``restart``: Megatron-LM with the default recovery — wait, resubmit, reload, recompute.

Mechanism and figures (the Unicron paper's production trace, docs/design.md §1): a fault leaves the
healthy ranks blocked in a collective until the NCCL timeout fires (up to 30 min; we charge the
full 30 min, as the paper's breakdown does, whatever the fault, since a process that dies does
not release its peers either); the job is resubmitted (9 min) and set up again (14 min), then
redoes the work since its last checkpoint (the paper's 15 min: half of a 30-min checkpoint
interval, ``checkpoint_interval_s / 2`` per job). Default restart: 68 min.

A faulty node (SEV1) is not isolated automatically: it is drained by hand "after hours"
(``DRAIN_S``, 2 h, the low end of "hours"); until then the resubmitted job lands on it again, so
it makes no progress before the drain. Then it restarts at its fixed size on a spare node if
one is free, else on the nodes it has left (a resubmission by hand with a smaller data-parallel
degree). It does not grow back when the node is repaired — only at its next restart, when it
takes free nodes back up to its size — unless it was left with no node at all: then it waits
in the queue and the repaired node starts it (resubmit + setup). Throughput is Megatron's:
the planner's model, no overhead.
"""

from __future__ import annotations

from typing import ClassVar

from unicron.simulator.policies.base import NodeOwnerPolicy, half_interval
from unicron.simulator.state import JobRun, Simulation
from unicron.simulator.trace import Failure

TIMEOUT_S = 30 * 60.0
RESUBMIT_S = 9 * 60.0
SETUP_S = 14 * 60.0
DRAIN_S = 2 * 3600.0


class Restart(NodeOwnerPolicy):
    name = "restart"
    regrows: ClassVar[bool] = False

    def detect_s(self, failure: Failure, run: JobRun) -> float:
        return TIMEOUT_S

    def recover_s(self, sim: Simulation, run: JobRun, failure: Failure, removed: bool) -> float:
        self.refill(sim, run)  # every restart takes free nodes back up to the job's size
        sim.set_workers(run, run.speeds.best_fit(sim.cluster.gpus_of(run.name)))
        drain = max(DRAIN_S - TIMEOUT_S, 0.0) if removed else 0.0
        return drain + RESUBMIT_S + SETUP_S + half_interval(run)

    def grow_s(self, sim: Simulation, run: JobRun) -> float:
        """A job left with no node waits in the queue; the repaired node restarts it."""
        return RESUBMIT_S + SETUP_S
