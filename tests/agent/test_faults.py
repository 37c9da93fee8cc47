"""Fault drills reach the right worker or are rejected; GPU slots go one per worker; a new boot
keeps an operator's drain or quarantine."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from unicron.services.agent import gpus
from unicron.services.agent.agent import Agent
from unicron.services.agent.channel import WorkerChannel
from unicron.services.agent.faults import FaultInjector
from unicron.services.agent.gpus import SlotPool
from unicron.services.agent.settings import AgentSettings
from unicron.services.agent.store import RendezvousStore
from unicron.services.agent.supervisor import CommandRejectedError, Supervisor, WorkerKey
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.messages import AGENT_COMMAND, FaultKind, FaultSpec, InjectFault
from unicron.shared.contracts.models import NodeRecord, NodeState, now
from unicron.shared.contracts.reports import WorkerExited, WorkerStarted
from unicron.shared.contracts.workerchannel import FaultDirective
from unicron.shared.store.state import StateStore

from tests.agent.conftest import RecordingSink, directives, start_cmd, until
from tests.agent.process import NODE

STEPPER = "step-20-40-40-0"


def fault(job: str, rank: int, kind: FaultKind, **spec: object) -> InjectFault:
    return InjectFault(
        job_id=job, generation=1, rank=rank, fault=FaultSpec(rank=rank, kind=kind, **spec)
    )


async def test_fault_reaches_the_right_worker_once(
    supervisor: Supervisor, channel: WorkerChannel, sink: RecordingSink
) -> None:
    injector = FaultInjector(channel, supervisor)
    for rank in (0, 1):
        await supervisor.start_worker(*start_cmd("job-a", STEPPER, rank=rank, steps=10_000))
    for rank in (0, 1):
        await until(lambda r=rank: channel.connected(WorkerKey("job-a", 1, r)))  # type: ignore[misc]
    first = fault("job-a", 1, FaultKind.EXCEPTION, message="boom")
    await injector.inject(first)
    await injector.inject(first)  # redelivered by the bus: still one fault
    last = fault("job-a", 1, FaultKind.SLOW, slowdown=3.0)
    await injector.inject(last)
    log = supervisor.log_path(WorkerKey("job-a", 1, 1))
    await until(lambda: len(directives(log)) == 2)  # lines arrive in order: no duplicate between
    got = directives(log)
    assert got == [FaultDirective(fault=f.fault) for f in (first, last)]
    assert directives(supervisor.log_path(WorkerKey("job-a", 1, 0))) == []
    assert sink.letters.empty()


async def test_fault_for_a_worker_out_of_reach(
    supervisor: Supervisor, channel: WorkerChannel, sink: RecordingSink
) -> None:
    injector = FaultInjector(channel, supervisor)
    with pytest.raises(CommandRejectedError, match="no live worker job-x g1 r0"):
        await injector.inject(fault("job-x", 0, FaultKind.CRASH))
    await supervisor.start_worker(*start_cmd("job-m", "mute"))  # never connects its channel
    pid = (await sink.next(WorkerStarted)).pid
    with pytest.raises(CommandRejectedError, match="no connected channel"):
        await injector.inject(fault("job-m", 0, FaultKind.EXCEPTION))
    await injector.inject(fault("job-m", 0, FaultKind.CRASH))  # the agent kills it itself
    exited = await sink.next(WorkerExited)
    assert (exited.pid, exited.signal, exited.stopped_by_agent) == (pid, signal.SIGKILL, False)


def test_drills_survive_the_bus_and_the_channel() -> None:
    """What the agent parses off the bus, and what the worker parses off the channel."""
    for spec in (
        FaultSpec(rank=0, kind=FaultKind.HANG),
        FaultSpec(rank=1, kind=FaultKind.EXIT, exit_code=7),
        FaultSpec(rank=2, kind=FaultKind.EXCEPTION, at_step=5),
    ):
        cmd = InjectFault(job_id="job-a", generation=1, rank=spec.rank, fault=spec)
        assert AGENT_COMMAND.validate_json(cmd.model_dump_json()) == cmd
        line = json.loads(json.dumps(FaultDirective(fault=spec).model_dump(mode="json")))
        assert FaultDirective.model_validate(line) == FaultDirective(fault=spec)


def cuda_visible(log: Path) -> object:
    lines = log.read_text().splitlines()
    return json.loads(lines[1])["cuda_visible_devices"] if len(lines) > 1 else "not yet"


async def test_each_worker_gets_its_own_gpu(
    supervisor: Supervisor, channel: WorkerChannel, sink: RecordingSink
) -> None:
    supervisor.slots.use(["3", "5"])  # as the agent does on a node with two GPUs
    for rank in (0, 1):
        await supervisor.start_worker(*start_cmd("job-g", "hang", rank=rank))
    pid = (await sink.next(WorkerStarted)).pid
    logs = [supervisor.log_path(WorkerKey("job-g", 1, rank)) for rank in range(3)]
    await until(lambda: [cuda_visible(log) for log in logs[:2]] == ["3", "5"])
    os.kill(pid, signal.SIGKILL)
    await sink.next(WorkerExited)
    await supervisor.start_worker(*start_cmd("job-g", "hang", rank=2))
    await until(lambda: cuda_visible(logs[2]) == "3")  # the slot freed by rank 0


async def test_devices_come_from_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpus.visible_devices() == []
    assert SlotPool([]).acquire() is None and SlotPool().env(None) == {}  # CPU: env untouched
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert gpus.visible_devices() == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")  # the node gave the agent a subset
    assert gpus.visible_devices() == ["4", "6"]


async def test_new_boot_keeps_a_drain_or_a_live_quarantine(
    bus: Bus, state: StateStore, tmp_path: Path
) -> None:
    store = RendezvousStore("127.0.0.1")
    await store.start()
    later, earlier = now() + 3600, now() - 1
    cases = [
        (NodeState.QUARANTINED, later, NodeState.QUARANTINED, later),
        (NodeState.DRAINED, None, NodeState.DRAINED, None),
        (NodeState.QUARANTINED, earlier, NodeState.READY, None),  # the cooldown ran out
        (NodeState.LOST, None, NodeState.READY, None),
    ]
    try:
        for old_state, until_at, new_state, new_until in cases:
            old = NodeRecord(id=NODE, state=old_state, quarantined_until=until_at, slots=9)
            await state.put_node(old.model_copy(update={"boot_id": "old", "used": 7}))
            agent = Agent(AgentSettings(node_id=NODE, data_dir=tmp_path), bus, state)
            agent.store = store
            for _ in range(2):  # registration, then a heartbeat: neither lifts the decision
                await agent.heartbeat_once()
                node = await state.get_node(NODE)
                assert node is not None
                assert (node.state, node.quarantined_until) == (new_state, new_until)
                assert (node.boot_id, node.slots, node.used) == (agent.boot_id, 2, 0)
    finally:
        store.close()
