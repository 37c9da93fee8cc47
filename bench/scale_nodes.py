"""The simulated nodes of ``bench/scale.py``: what one node agent does for the control plane,
with fake ranks instead of torch processes.

A :class:`SimNode` keeps its record in Redis as the agent's registration and heartbeat do (the
same ``StateStore`` calls, once per ``heartbeat_interval_s``), and turns the commands addressed
to it into the reports a real agent's workers send: ``WorkerStarted`` for a launch, and
``WorkerRegrouped`` for a joiner of an in-place generation or a survivor told to re-form,
``WorkerExited`` for a stop. Stepping is the fleet's (``bench/scale_fleet.py``); a fault makes
the node report as a real one does (:meth:`SimNode.fault_reports`).
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field

from unicron.shared.contracts.identity import WorkerKey, who
from unicron.shared.contracts.messages import RegroupWorker, StartWorker, StopWorkers
from unicron.shared.contracts.models import NodeRecord, NodeState, NodeWorker, now
from unicron.shared.contracts.reports import (
    AnyReport,
    WorkerException,
    WorkerExited,
    WorkerHung,
    WorkerRegrouped,
    WorkerStarted,
)
from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.shared.contracts.transitions import StateSource

_pids = itertools.count(10_000)
PEER_ERROR = "Connection reset by peer: a peer of this collective went away"


@dataclass
class SimRank:
    key: WorkerKey
    pid: int
    world_size: int
    parked: bool = False  # its collective broke: it waits for a regroup, stepping nothing


@dataclass
class SimNode:
    node_id: str
    slots: int
    alive: bool = True
    boot_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    ranks: dict[WorkerKey, SimRank] = field(default_factory=dict)

    # --- registration and heartbeat -------------------------------------------------------

    def record(self) -> NodeRecord:
        return NodeRecord(
            id=self.node_id, state=NodeState.READY, slots=self.slots, gpus=self.slots,
            used=len(self.ranks), last_heartbeat=now(), host="127.0.0.1", store_port=1,
            boot_id=self.boot_id, workers=self.inventory(),
        )  # fmt: skip

    def inventory(self) -> list[NodeWorker]:
        return [NodeWorker(**r.key._asdict(), pid=r.pid) for r in self.ranks.values()]

    def beat(self, node: NodeRecord) -> bool:
        """The heartbeat's change to the record (``NodeRegistration._beat`` of the agent)."""
        if node.boot_id != self.boot_id:
            return False
        node.last_heartbeat = now()
        node.used = len(self.ranks)
        node.workers = self.inventory()
        return True

    def reboot(self) -> None:
        """A lost node comes back: a new boot, no workers."""
        self.alive, self.boot_id, self.ranks = True, uuid.uuid4().hex, {}

    # --- commands ---------------------------------------------------------------------------

    def start(self, cmd: StartWorker, next_step: int) -> list[AnyReport]:
        if cmd.key in self.ranks:  # a redelivered command: the worker runs already
            return []
        rank = self.ranks[cmd.key] = SimRank(cmd.key, next(_pids), cmd.world_size)
        started: list[AnyReport] = [WorkerStarted(**who(self.node_id, cmd.key), pid=rank.pid)]
        if cmd.state_source_rank is None:
            return started
        return [*started, self._regrouped(rank, StateSource.PEER, next_step)]

    def regroup(self, cmd: RegroupWorker, next_step: int) -> list[AnyReport]:
        old = WorkerKey(cmd.job_id, cmd.from_generation, cmd.from_rank)
        rank = self.ranks.pop(old, None)
        if rank is None:
            return []  # gone, or re-formed already by this command's first delivery
        new = cmd.directive.key
        moved = self.ranks[new] = SimRank(new, rank.pid, cmd.directive.world_size)
        return [self._regrouped(moved, StateSource.MEMORY, next_step)]

    def stop(self, cmd: StopWorkers) -> list[AnyReport]:
        gone = [
            key
            for key in self.ranks
            if key.job_id == cmd.job_id
            and (cmd.below_generation is None or key.generation < cmd.below_generation)
        ]
        return [self._exited(self.ranks.pop(key), signal=15, by_agent=True) for key in gone]

    def _regrouped(self, rank: SimRank, source: StateSource, next_step: int) -> WorkerRegrouped:
        return WorkerRegrouped(
            **who(self.node_id, rank.key), pid=rank.pid, world_size=rank.world_size,
            regroup_s=0.001, state_source=source, resumed_step=next_step,
        )  # fmt: skip

    def _exited(self, rank: SimRank, signal: int | None, by_agent: bool = False) -> WorkerExited:
        code = None if signal is not None else 1
        return WorkerExited(
            **who(self.node_id, rank.key), pid=rank.pid, exit_code=code, signal=signal,
            stopped_by_agent=by_agent,
        )  # fmt: skip

    # --- faults -----------------------------------------------------------------------------

    def fault_reports(self, kind: str, key: WorkerKey) -> list[AnyReport]:
        """What this node reports when ``kind`` strikes its rank ``key``: a crash is an exit by
        SIGKILL, an exception is reported and then the rank exits, a hang is the agent's hang
        verdict. A node loss reports nothing: the node falls silent."""
        rank = self.ranks.get(key)
        if rank is None:
            return []
        if kind == "node_loss":
            self.alive = False
            return []
        if kind == "hang":
            rank.parked = True
            return [self._hung(rank, "compute")]
        del self.ranks[key]
        if kind == "crash":
            return [self._exited(rank, signal=9)]
        exception = WorkerException(
            **who(self.node_id, key), pid=rank.pid, exc_type="RuntimeError",
            message="injected fault", category=FailureCategory.SOFTWARE_OTHER,
        )  # fmt: skip
        return [exception, self._exited(rank, signal=None)]

    def peer_reports(self, kind: str, job_id: str, generation: int) -> list[AnyReport]:
        """What this node's other ranks of the generation report when a peer fails: the
        collective breaks (they park and say why), or, behind a hang, they wait in it."""
        reports: list[AnyReport] = []
        for rank in self.ranks.values():
            if rank.key.job_id != job_id or rank.key.generation != generation or rank.parked:
                continue
            rank.parked = True
            if kind == "hang":
                reports.append(self._hung(rank, "collective"))
                continue
            reports.append(self._peer_failed(rank))
        return reports

    def _peer_failed(self, rank: SimRank) -> WorkerException:
        return WorkerException(
            **who(self.node_id, rank.key), pid=rank.pid, exc_type="DistBackendError",
            message=PEER_ERROR, category=FailureCategory.CONNECTION_RESET, parked=True,
        )  # fmt: skip

    def _hung(self, rank: SimRank, phase: str) -> WorkerHung:
        return WorkerHung(
            **who(self.node_id, rank.key), pid=rank.pid, silent_s=3.0, threshold_s=3.0,
            mean_iteration_s=1.0, process_state="S", phase=phase,
        )  # fmt: skip
