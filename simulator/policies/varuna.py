"""``varuna``: Varuna (Athlur et al., EuroSys'22) — morph by checkpoint and restart.

Mechanism: Varuna trains with pipeline and data parallelism only — no intra-layer (tensor)
parallelism, so it runs on commodity networks — and, when the set of machines changes, it
"morphs": the job checkpoints (or, after a failure, falls back to its last checkpoint), picks a
new (PP, DP) configuration for the machines it has, and restarts. Its failure-free throughput is
the planner's performance model restricted to TP = 1 (``max_tp=1``): the mechanism's cost,
computed rather than assumed. A SEV1 fault takes the node away (the job morphs to fewer
nodes, and back when it is repaired: a checkpoint-and-restart without recomputation); other
faults restart the job in place from its checkpoint.

Downtime of a restart: a fresh process with its runtime on every rank (the cluster preset's
``launch_s``), reading each rank's shard of the checkpoint from local disk (preset
``disk_bw``), and the work since the checkpoint (half an interval). Detection as Oobleck's: an
exit within a second, a hang at the 10-min collective timeout.
"""

from __future__ import annotations

from dataclasses import replace

from unicron.planning.throughput import MegatronThroughput
from unicron.simulator.inputs import ClusterConfig, JobConfig
from unicron.simulator.policies.base import NodeOwnerPolicy, half_interval, shard_bytes
from unicron.simulator.policies.oobleck import elastic_detect_s
from unicron.simulator.state import JobRun, Simulation
from unicron.simulator.trace import Failure
from unicron.simulator.workload import Speeds


class Varuna(NodeOwnerPolicy):
    name = "varuna"

    def speeds(self, job: JobConfig, config: ClusterConfig) -> Speeds:
        spec = replace(config.spec, max_tp=1)
        return Speeds(MegatronThroughput(spec), job, config.gpus, config.gpus_per_node)

    def detect_s(self, failure: Failure, run: JobRun) -> float:
        return elastic_detect_s(failure)

    def _relaunch(self, sim: Simulation, run: JobRun) -> float:
        spec = sim.config.spec
        return spec.launch_s + shard_bytes(sim.config, run, run.workers) / spec.disk_bw

    def recover_s(self, sim: Simulation, run: JobRun, failure: Failure, removed: bool) -> float:
        return self._relaunch(sim, run) + half_interval(run)

    def grow_s(self, sim: Simulation, run: JobRun) -> float:
        return self._relaunch(sim, run)
