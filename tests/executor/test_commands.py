"""The regroup a survivor gets names the hosts it must stop waiting for."""

from __future__ import annotations

from unicron.services.executor.commands import regroup_commands, start_commands
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


def test_a_start_and_a_regroup_carry_the_seat_as_their_json_always_had() -> None:
    # The agent and the worker parse these lines: field names, order and values are the wire.
    nodes = {
        "a": node("a", "10.0.0.1"),
        "b": node("b", "10.0.0.2"),
        "c": node("c", "10.0.0.9", NodeState.LOST),
    }
    fresh = [WorkerRecord(rank=r, node_id=n, state_source_rank=0) for r, n in ((1, "a"), (2, "b"))]
    job = Job(
        id="j", name="j", spec=JobSpec(name="j"), generation=3, world_size=3,
        workers=[survivor(0, "a"), *fresh],
    )  # fmt: skip
    seat = '"world_size":3,"rendezvous":{"host":"10.0.0.1","port":29500,"prefix":"j/g3/"}'
    starts = [(n, c.model_dump_json()) for n, c in start_commands(job, nodes)]
    assert starts == [
        ("a", '{"job_id":"j","generation":3,"rank":1,' + seat + ',"state_source_rank":0,'
              '"kind":"start_worker","command_id":"start:j:3:1","local_rank":1,'
              '"local_world_size":2,"group_rank":0}'),
        ("b", '{"job_id":"j","generation":3,"rank":2,' + seat + ',"state_source_rank":0,'
              '"kind":"start_worker","command_id":"start:j:3:2","local_rank":0,'
              '"local_world_size":1,"group_rank":1}'),
    ]  # fmt: skip
    [(to, regroup)] = regroup_commands(job, nodes)
    assert (to, regroup.directive.model_dump_json()) == (
        "a",
        '{"job_id":"j","generation":3,"rank":0,' + seat + ',"state_source_rank":null,'
        '"directive":"regroup","lost_hosts":["10.0.0.9"]}',
    )
