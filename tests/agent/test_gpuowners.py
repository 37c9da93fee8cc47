"""Whose GPU a health report is about (issue 21): an agent placed on some of a host's GPUs
reports a fault of one of them with the ranks holding it, retires it so that no replacement is
started on it, and leaves the host's other GPUs to their own agents. On CPU through the seams the
agent uses: the slots take a device list, NVML is the recorded H200 four times over
(``tests/agent/fakenvml.py``), and the workers are real processes of the fake worker."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from unicron.services.agent import agent as agent_module
from unicron.services.agent.agent import Agent
from unicron.services.agent.gpuowners import GpuOwners
from unicron.services.agent.gpus import NoFreeGPUError, SlotPool
from unicron.services.agent.settings import AgentSettings
from unicron.services.agent.supervisor import Supervisor
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.identity import JobRank
from unicron.shared.contracts.reports import (
    REPORT,
    REPORT_SUBJECT_PREFIX,
    GpuHealthReport,
    WorkerException,
    WorkerExited,
    WorkerStarted,
)
from unicron.shared.store.state import StateStore

from tests.agent.conftest import RecordingSink, start_cmd, until
from tests.agent.fakenvml import FakeNvml, Reports, watching
from tests.agent.process import NODE, inbox
from tests.agent.test_gpus import registered, running_agent


@pytest.fixture(autouse=True)
def pci_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the agent sets it before CUDA starts (``visible_devices``)."""
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def test_an_nvml_gpu_is_placed_by_index_or_uuid_among_the_agent_s_devices() -> None:
    fake = FakeNvml.h200_node(4)
    uuids = [gpu.uuid for gpu in fake.gpus]
    pool = SlotPool(["2", "3"], slots=1)  # two GPUs of the host are its, one a slot
    assert [(p.known, p.ours, p.slot) for p in (pool.place(i, u) for i, u in enumerate(uuids))] == [
        (True, False, None), (True, False, None), (True, True, 0), (True, True, None),
    ]  # fmt: skip
    by_uuid = SlotPool([uuids[1][:12]])  # CUDA takes a unique prefix of a UUID
    assert by_uuid.place(1, uuids[1]).slot == 0 and not by_uuid.place(0, uuids[0]).ours
    assert not SlotPool().place(0, uuids[0]).known  # no device found: cannot tell


def test_an_index_under_another_cuda_order_or_a_mig_instance_is_not_guessed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not SlotPool(["MIG-5c2a"]).place(0, "GPU-ffdc").known
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")  # CUDA's indices may not be NVML's
    assert not SlotPool(["0", "1"]).place(0, "GPU-ffdc").known


def test_a_retired_gpu_is_handed_out_no_more_and_the_node_has_a_slot_fewer() -> None:
    pool = SlotPool(["2", "3"])
    pool.retire(0, "Xid 79: the GPU has fallen off the bus")
    pool.retire(0, "again")  # once: a second fault of it changes nothing
    assert (pool.count, pool.free(), pool.acquire()) == (1, 1, 1)
    with pytest.raises(NoFreeGPUError, match=r"retired as faulty: 2: Xid 79"):
        pool.acquire()


async def test_a_fault_of_a_held_gpu_names_its_rank_and_no_replacement_lands_on_it(
    supervisor: Supervisor, sink: RecordingSink
) -> None:
    supervisor.slots.use(["2", "3"])  # this agent's half of a four-GPU host
    for rank in (0, 1):
        await supervisor.start_worker(*start_cmd("job-g", "hang", rank=rank))
        await sink.next(WorkerStarted)
    fake = FakeNvml.h200_node(4)
    reports = Reports()
    owners = GpuOwners("n1", supervisor.slots, supervisor.live, reports)
    async with watching(fake, sink=owners):
        with capture_logs() as logs:
            fake.xid(0, 79)  # another agent's GPU: not this one's to report
            fake.xid(3, 79)  # slot 1: rank 1's
            report = await reports.next()
    assert (report.gpu, report.uuid, report.evidence["xid"]) == (3, fake.gpus[3].uuid, 79)
    assert report.held_by == [JobRank(job_id="job-g", generation=1, rank=1)]
    assert reports.queue.empty()
    assert any(e["event"] == "GPU fault on a GPU this agent does not use" for e in logs)
    assert supervisor.slots.count == 1  # the node now registers one slot

    again = "GPU fault on a GPU already retired"
    with capture_logs() as logs:  # the retired GPU's later faults are not sent again
        async with watching(fake, sink=owners):
            fake.xid(3, 48)
            await until(lambda: any(e["event"] == again for e in logs))
            fake.answer(2, "clocks_event_reasons", 0x40)  # rank 0's GPU slows down: reported
            assert (await reports.next()).gpu == 2
    assert reports.queue.empty()

    # rank 1 dies of it; its replacement here is refused the faulty GPU, never put on it
    victim = next(w for w in supervisor.live() if w.key.rank == 1)
    os.kill(victim.proc.pid, signal.SIGKILL)
    await sink.next(WorkerExited)
    await supervisor.start_worker(*start_cmd("job-g", "hang", generation=2, rank=1))
    refused = await sink.next(WorkerException)
    assert refused.exc_type == "NoFreeGPUError"
    assert "retired as faulty: 3: Xid 79: the GPU has fallen off the bus" in refused.message
    assert [w.slot for w in supervisor.live()] == [0]


async def test_a_slowdown_of_a_held_gpu_names_its_rank_and_keeps_the_gpu(
    supervisor: Supervisor, sink: RecordingSink
) -> None:
    supervisor.slots.use(["0"])
    await supervisor.start_worker(*start_cmd("job-s", "hang", rank=4))
    await sink.next(WorkerStarted)
    fake = FakeNvml.h200_node(1)
    reports = Reports()
    async with watching(fake, sink=GpuOwners("n1", supervisor.slots, supervisor.live, reports)):
        fake.answer(0, "clocks_event_reasons", 0x40)  # thermal: a straggler hint, not a fault
        report = await reports.next()
    assert report.held_by == [JobRank(job_id="job-s", generation=1, rank=4)]
    assert (supervisor.slots.count, supervisor.slots.retired) == (1, {})


async def test_the_agent_registers_a_slot_fewer_once_a_gpu_of_its_own_is_faulty(
    bus: Bus, state: StateStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent as it runs: its watch goes through the owners to the bus, and the planner's
    view of the node (its record) loses the faulty GPU's slot at the next heartbeat."""
    monkeypatch.setattr(agent_module, "visible_devices", lambda: ["0", "1"])
    fake = FakeNvml.h200_node(2)
    settings = AgentSettings(node_id=NODE, data_dir=tmp_path, spares=0, checkpoint_mirror_s=0,
                             gpu_health_s=0.05, heartbeat_interval_s=0.2)  # fmt: skip
    agent = Agent(settings, bus, state)
    agent.gpu_health.load = lambda: fake
    heard = await inbox(bus, f"{REPORT_SUBJECT_PREFIX}{NODE}.gpu_health", REPORT.validate_json)
    async with running_agent(agent):
        assert (await registered(state, agent)).slots == 2
        await until(lambda: fake.looks >= 1, within=30)
        fake.xid(1, 48)
        report = await heard.next(lambda r: isinstance(r, GpuHealthReport), within=15)
        assert isinstance(report, GpuHealthReport)
        assert (report.gpu, report.held_by) == (1, [])  # nobody trains on it yet
        async with asyncio.timeout(15):  # the next heartbeat writes it
            while True:
                node = await state.get_node(NODE)
                if node is not None and node.slots == 1:
                    break
                await asyncio.sleep(0.05)
        assert node.retired_gpus == {"1": "Xid 48: a double-bit ECC error"}  # as operators see it
        assert agent.slots.acquire() == 0 and agent.slots.free() == 0
