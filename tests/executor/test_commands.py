"""The regroup a survivor gets names the hosts it must stop waiting for."""

from __future__ import annotations

from unicron.services.executor.commands import regroup_commands
from unicron.shared.contracts.models import (
    Job,
    JobSpec,
    NodeRecord,
    NodeState,
    WorkerRecord,
    WorkerState,
)


def node(name: str, host: str, state: NodeState = NodeState.READY) -> NodeRecord:
    return NodeRecord(id=name, host=host, state=state, slots=1, store_port=29500)


def survivor(rank: int, node_id: str) -> WorkerRecord:
    return WorkerRecord(
        rank=rank, node_id=node_id, state=WorkerState.RUNNING, from_generation=1, from_rank=rank
    )


def test_survivors_sever_only_lost_hosts_that_no_rank_still_runs_on() -> None:
    nodes = {
        "a": node("a", "10.0.0.1"),
        "b": node("b", "10.0.0.2", NodeState.LOST),  # cut off: its connections are dead
        "c": node("c", "10.0.0.3"),
        "d": node("d", "10.0.0.3", NodeState.LOST),  # shares c's address: c's ranks live on
    }
    job = Job(
        id="j", name="j", spec=JobSpec(name="j"), generation=2, world_size=2,
        workers=[survivor(0, "a"), survivor(1, "c")],
    )  # fmt: skip
    commands = regroup_commands(job, nodes)
    assert [cmd.directive.lost_hosts for _, cmd in commands] == [["10.0.0.2"], ["10.0.0.2"]]
