"""Agent commands for a job's generation: who to start where, whom to stop.

Command ids are derived from (job, generation, rank / node), so a command sent again after a
crash or a redelivered plan is dropped by NATS, and agents treat it as a no-op anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TypedDict

from unicron.shared.bus.api import command_message
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.messages import (
    AnyAgentCommand,
    RegroupDirective,
    RegroupWorker,
    Rendezvous,
    StartWorker,
    StopWorkers,
)
from unicron.shared.contracts.models import Job, NodeRecord, NodeState, WorkerRecord, WorkerState
from unicron.shared.contracts.transitions import TransitionMode

SEND_AT_ONCE = 256


class MissingNodeError(RuntimeError):
    """A plan placed a rank on a node that is not registered."""


def rendezvous_for(job: Job, nodes: dict[str, NodeRecord]) -> Rendezvous:
    """Rank 0's agent hosts the store; a new generation meets under a new prefix."""
    host_node = nodes.get(job.workers[0].node_id)
    if host_node is None:
        raise MissingNodeError(f"node {job.workers[0].node_id} of rank 0 is not registered")
    return Rendezvous(
        host=host_node.host, port=host_node.store_port, prefix=f"{job.id}/g{job.generation}/"
    )


def placement(job: Job) -> dict[int, tuple[int, int, int]]:
    """Rank → (local rank, local world size, group rank): a rank's index among the job's ranks
    on its node, how many the node has, and the node's index in order of first rank."""
    ordered = sorted(job.workers, key=lambda w: w.rank)
    groups: dict[str, list[int]] = {}
    for worker in ordered:
        groups.setdefault(worker.node_id, []).append(worker.rank)
    group_of = {node_id: index for index, node_id in enumerate(groups)}
    return {
        w.rank: (groups[w.node_id].index(w.rank), len(groups[w.node_id]), group_of[w.node_id])
        for w in ordered
    }


class _Seat(TypedDict):
    """The fields of :class:`GroupSeat`, the base of both a start and a regroup: typed, so
    mypy checks what is unpacked into either."""

    job_id: str
    generation: int
    rank: int
    world_size: int
    rendezvous: Rendezvous
    state_source_rank: int | None


def _seat(job: Job, worker: WorkerRecord, rendezvous: Rendezvous) -> _Seat:
    """``worker``'s seat in the job's current generation, to unpack into either message."""
    return _Seat(
        job_id=job.id,
        generation=job.generation,
        rank=worker.rank,
        world_size=job.world_size,
        rendezvous=rendezvous,
        state_source_rank=worker.state_source_rank,
    )


def start_commands(
    job: Job, nodes: dict[str, NodeRecord], ask: int = 0
) -> list[tuple[str, StartWorker]]:
    """A start for every rank that needs a new process (survivors re-form in place). It names
    the job and the seat only: the agent reads what to run from the job record.

    ``ask`` > 0 asks again: only the ranks still LAUNCHING, each under a command id of its own
    ask, since JetStream drops a resent id as a duplicate for its two-minute window (the agent
    ignores a start of a worker it knows)."""
    rendezvous = rendezvous_for(job, nodes)
    seats = placement(job)
    again = f":ask{ask}" if ask else ""
    return [
        (
            worker.node_id,
            StartWorker(
                **_seat(job, worker, rendezvous),
                command_id=f"start:{job.id}:{job.generation}:{worker.rank}{again}",
                local_rank=seats[worker.rank][0],
                local_world_size=seats[worker.rank][1],
                group_rank=seats[worker.rank][2],
            ),
        )
        for worker in job.workers
        if not worker.survivor and (not ask or worker.state == WorkerState.LAUNCHING)
    ]


def lost_hosts(job: Job, nodes: dict[str, NodeRecord]) -> list[str]:
    """Addresses of lost nodes that no rank of the new generation runs on: a survivor's
    connections to them are dead even if nothing says so (a cut link, trainer/sever.py)."""
    kept = {nodes[w.node_id].host for w in job.workers if w.node_id in nodes}
    return sorted({n.host for n in nodes.values() if n.state == NodeState.LOST} - kept)


def regroup_commands(job: Job, nodes: dict[str, NodeRecord]) -> list[tuple[str, RegroupWorker]]:
    """A regroup for every survivor: re-form in place as its new rank of this generation."""
    rendezvous = rendezvous_for(job, nodes)
    lost = lost_hosts(job, nodes)
    commands = []
    for worker in job.workers:
        if worker.from_generation is None or worker.from_rank is None:
            continue
        directive = RegroupDirective(**_seat(job, worker, rendezvous), lost_hosts=lost)
        command = RegroupWorker(
            command_id=f"regroup:{job.id}:{job.generation}:{worker.from_rank}",
            job_id=job.id,
            from_generation=worker.from_generation,
            from_rank=worker.from_rank,
            directive=directive,
        )
        commands.append((worker.node_id, command))
    return commands


async def send_all(bus: Bus, commands: Sequence[tuple[str, AnyAgentCommand]]) -> None:
    """Publish ``commands`` pipelined, ``SEND_AT_ONCE`` in flight: one at a time, a job of
    4,096 ranks took 90 s to start under load (bench/scale.py). JetStream stores them in the
    order they are sent, so each node's commands still arrive in order."""
    for start in range(0, len(commands), SEND_AT_ONCE):
        chunk = commands[start : start + SEND_AT_ONCE]
        await asyncio.gather(*(bus.send_command(node_id, cmd) for node_id, cmd in chunk))


async def send_starts(bus: Bus, job: Job, nodes: dict[str, NodeRecord], ask: int = 0) -> None:
    await send_all(bus, start_commands(job, nodes, ask))


def split_starts(
    job: Job, before: Job, starts: list[tuple[str, StartWorker]]
) -> tuple[list[tuple[str, StartWorker]], list[tuple[str, StartWorker]]]:
    """The starts that may go before the regroups and the stop, and those that wait for them.

    A node where every older worker of the job that is not kept has exited has its seats free
    already (the agent releases a slot before it reports the exit): a joiner started there
    first runs while the survivors re-form, and the recovery, which waits for the joiner, is
    that much shorter. Where an older worker may still run (a hung culprit, a resize) the
    start waits for the stop, as one rank per GPU needs."""
    kept = {w.from_rank for w in job.workers if w.from_generation is not None}
    live = (WorkerState.LAUNCHING, WorkerState.RUNNING)
    busy = {w.node_id for w in before.workers if w.rank not in kept and w.state in live}
    early = [(node_id, cmd) for node_id, cmd in starts if node_id not in busy]
    return early, [(node_id, cmd) for node_id, cmd in starts if node_id in busy]


def stop_targets(job: Job, before: Job, nodes: dict[str, NodeRecord]) -> list[str]:
    """Every node that may run an older worker of the job: those of its generation before and
    now, and any whose last heartbeat lists one of its workers (one a lost stop left behind, a
    lost node's on its return). Not every node of the cluster: that was a command per node per
    transition of any job."""
    ids = {w.node_id for w in job.workers} | {w.node_id for w in before.workers}
    ids |= {n.id for n in nodes.values() if any(w.job_id == job.id for w in n.workers)}
    return sorted(ids)


async def send_stops(
    bus: Bus, job: Job, node_ids: list[str], below_generation: int | None, reason: str
) -> None:
    """Stop the job's older workers on ``node_ids`` (``stop_targets``); a lost node gets it
    on return."""
    await send_all(bus, stop_commands(job, node_ids, below_generation, reason))


def stop_commands(
    job: Job, node_ids: list[str], below_generation: int | None, reason: str
) -> list[tuple[str, StopWorkers]]:
    return [
        (node_id, StopWorkers(
            command_id=f"stop:{job.id}:{below_generation}:{node_id}", job_id=job.id,
            below_generation=below_generation, reason=reason,
        ))
        for node_id in node_ids
    ]  # fmt: skip


async def send_generation(
    bus: Bus, job: Job, before: Job, nodes: dict[str, NodeRecord], reason: str, starting: bool
) -> None:
    """The commands that take the job from ``before`` to its new generation.

    Per node, commands run in order: the regroups raise the survivors' generation before the
    stop, which then ends only the old generation's other processes (a hung culprit, say), and
    the starts come last, onto the GPUs the stop freed: one rank per GPU — except onto nodes
    whose seats are free already (``split_starts``), which go first. ``starting`` False: the
    job gave up, and its workers are only stopped."""
    starts: list[tuple[str, StartWorker]] | None = None
    with contextlib.suppress(MissingNodeError):  # raised below, after the stops went out
        starts = start_commands(job, nodes) if starting else []
    early, late = split_starts(job, before, starts or [])
    in_place = job.transition_kind == TransitionMode.IN_PLACE and starting
    regroups = regroup_commands(job, nodes) if in_place else []
    stops = stop_commands(job, stop_targets(job, before, nodes), job.generation, reason)
    # All of them on the fast lane at once, in order: a commands stream that is electing a
    # leader then holds up storing each group, not the survivors' regroups behind it.
    ordered: list[tuple[str, AnyAgentCommand]] = [*early, *regroups, *stops, *late]
    await bus.lane_ahead([command_message(node_id, command) for node_id, command in ordered])
    for group in (early, regroups, stops):
        await send_all(bus, group)
    if starts is None:
        await send_starts(bus, job, nodes)  # raises MissingNodeError
    await send_all(bus, late)
