"""``oobleck``: Oobleck (Jang et al., SOSP'23) — reconfigure from pipeline templates, no restart.

Mechanism: Oobleck pre-generates pipeline templates for every node count the job may run on
and keeps at least f+1 pipeline replicas, so when a node fails it instantiates new pipelines
from the templates on the surviving nodes, copies the layers the lost node held from a replica,
and carries on with the same global batch: no restart, no checkpoint reload. It treats every
failure as the loss of the node (it has no in-place reattempt or process restart); a node whose
fault left it healthy rejoins once its processes are relaunched, which is another
reconfiguration.

Figures: reconfiguration in "tens of seconds" (``RECONFIGURE_S`` = 30 s, plus the copy of the
lost ranks' shard from a peer over the network, as the planner's cost model prices it, plus
the interrupted iteration); Oobleck reports up to 29.6x the throughput of Bamboo and Varuna
under frequent failures, and a small failure-free cost for heterogeneous pipelines
(``OVERHEAD`` = 0.95: our estimate of the imbalance of heterogeneous templates, not a
published figure). Detection: a crash or exception makes the process exit, which its agents
see within a second (``EXIT_S``); a hang is only seen when the collective times out (PyTorch's
default NCCL timeout, 10 min); a machine that stops answering, after ``NODE_S``.
"""

from __future__ import annotations

from unicron.simulator.policies.base import NodeOwnerPolicy, detection_class, shard_bytes
from unicron.simulator.state import JobRun, Simulation
from unicron.simulator.trace import Failure

EXIT_S = 1.0
NODE_S = 10.0
TIMEOUT_S = 600.0  # torch.distributed's default NCCL timeout
RECONFIGURE_S = 30.0
OVERHEAD = 0.95


def elastic_detect_s(failure: Failure) -> float:
    kind = detection_class(failure.category)
    return TIMEOUT_S if kind == "hang" else NODE_S if kind == "node" else EXIT_S


class Oobleck(NodeOwnerPolicy):
    name = "oobleck"

    def overhead(self, run: JobRun, workers: int) -> float:
        return OVERHEAD

    def removes_node(self, failure: Failure) -> bool:
        return True

    def detect_s(self, failure: Failure, run: JobRun) -> float:
        return elastic_detect_s(failure)

    def _reconfigure(self, sim: Simulation, run: JobRun) -> float:
        copy = shard_bytes(sim.config, run, run.workers) / sim.config.spec.inter_bw
        return RECONFIGURE_S + copy

    def recover_s(self, sim: Simulation, run: JobRun, failure: Failure, removed: bool) -> float:
        step = run.speeds.iteration_s(run.workers) if run.workers else 0.0
        return self._reconfigure(sim, run) + step

    def grow_s(self, sim: Simulation, run: JobRun) -> float:
        return self._reconfigure(sim, run)
