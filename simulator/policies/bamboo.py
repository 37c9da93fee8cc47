"""``bamboo``: Bamboo (Thorpe et al., NSDI'23) — redundant computation across pipeline stages.

Mechanism: every pipeline stage also holds its successor's layers and runs their forward pass
(eager forward redundant computation, scheduled into the pipeline bubbles), so when a node is
preempted its predecessor already has what it needs and takes over: the pipeline is re-formed
without a restart or a checkpoint reload. Like Oobleck it treats every fault as the node's loss;
the node rejoins once healthy (another re-formation).

Failure-free overhead, from the mechanism on the planner's configuration of each job: one more
forward of a stage's layers is a third of the stage's forward + backward work; what fits in the
1F1B bubble, (p - 1) / (m + p - 1) of a step, is free. Factor = 1 / (1 + max(0, 1/3 -
bubble)). With PP = 1 there is no successor stage, and Bamboo's redundancy needs a pipeline, so
the same one-third applies in full. The memory of the redundant layers (which would rule out
some configurations) is not charged: generous to Bamboo. Recovery: ``RECONFIGURE_S`` (30 s) to
re-form the pipeline around the shadow stage plus the interrupted iteration; detection as
Oobleck's.
"""

from __future__ import annotations

from unicron.simulator.policies.base import NodeOwnerPolicy
from unicron.simulator.policies.oobleck import RECONFIGURE_S, elastic_detect_s
from unicron.simulator.state import JobRun, Simulation
from unicron.simulator.trace import Failure
from unicron.simulator.workload import shape_for

FORWARD_SHARE = 1.0 / 3.0


class Bamboo(NodeOwnerPolicy):
    name = "bamboo"

    def overhead(self, run: JobRun, workers: int) -> float:
        _, pp, dp, micro = run.speeds.config(workers)
        if pp <= 0:
            return 1.0
        _, batch, _ = shape_for(run.config.params_b)
        m = -(-batch // max(micro * dp, 1))
        bubble = (pp - 1) / (m + pp - 1)
        return 1.0 / (1.0 + max(0.0, FORWARD_SHARE - bubble))

    def removes_node(self, failure: Failure) -> bool:
        return True

    def detect_s(self, failure: Failure, run: JobRun) -> float:
        return elastic_detect_s(failure)

    def recover_s(self, sim: Simulation, run: JobRun, failure: Failure, removed: bool) -> float:
        step = run.speeds.iteration_s(run.workers) if run.workers else 0.0
        return RECONFIGURE_S + step

    def grow_s(self, sim: Simulation, run: JobRun) -> float:
        return RECONFIGURE_S
