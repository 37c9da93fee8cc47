"""One rank per GPU: a node's slots follow its GPUs, a worker never shares a device, and each
sees exactly its own. On CPU through the seams the agent uses: ``SlotPool`` takes the device
list, and ``visible_devices`` (what CUDA shows the agent) is replaced by a list."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from unicron.services.agent import agent as agent_module
from unicron.services.agent.agent import Agent, run
from unicron.services.agent.channel import WorkerChannel
from unicron.services.agent.gpus import CPU_SLOTS, NoFreeGPUError, SlotPool, SlotsError
from unicron.services.agent.launch import process_launch
from unicron.services.agent.registry import EntrypointRegistry
from unicron.services.agent.settings import AgentSettings
from unicron.services.agent.spares import SparePool
from unicron.services.agent.supervisor import Supervisor, WorkerKey
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.models import NodeRecord
from unicron.shared.contracts.reports import WorkerException, WorkerExited, WorkerStarted
from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.shared.store.state import StateStore

from tests.agent.conftest import RecordingSink, spare_pool, start_cmd, until
from tests.agent.process import FAKE_WORKER, NODE
from tests.agent.test_entrypoints import plain_start
from tests.agent.test_faults import cuda_visible

# --- the node's slots ----------------------------------------------------------------------


def test_slots_follow_the_gpu_count_unless_fewer_are_asked_for() -> None:
    assert SlotPool(["0", "1", "2", "3"]).count == 4  # UNICRON_SLOTS unset: one per GPU
    fewer = SlotPool(["4", "6", "7"], slots=2)
    assert (fewer.count, fewer.gpus, fewer.devices) == (2, 3, ["4", "6"])  # each its own
    assert [fewer.env(fewer.acquire()) for _ in range(2)] == [
        {"CUDA_VISIBLE_DEVICES": "4"},
        {"CUDA_VISIBLE_DEVICES": "6"},
    ]
    assert (SlotPool().count, SlotPool(slots=5).count) == (CPU_SLOTS, 5)  # a CPU node


def test_more_slots_than_gpus_are_refused_naming_the_setting_and_the_gpu_count() -> None:
    with pytest.raises(SlotsError) as refused:
        SlotPool(["0", "1"], slots=3)
    assert "UNICRON_SLOTS=3 is more than the 2 GPU(s) this node has (0,1)" in str(refused.value)
    assert "set UNICRON_SLOTS to 2 or fewer" in str(refused.value)


def test_a_cpu_node_hands_out_no_device_and_leaves_the_environment_alone() -> None:
    pool = SlotPool(slots=1)
    assert [pool.acquire() for _ in range(3)] == [None] * 3  # the plan is the authority here
    assert pool.env(None) == {}


def test_a_gpu_node_with_every_device_held_refuses_instead_of_sharing() -> None:
    pool = SlotPool(["3", "5"])
    assert (pool.acquire(), pool.acquire()) == (0, 1)
    with pytest.raises(NoFreeGPUError):
        pool.acquire()
    pool.release(0)
    assert pool.acquire() == 0  # the freed device, and only it
    zero = SlotPool(["0", "1"], slots=0)  # a GPU node asked for no slots starts nothing
    with pytest.raises(NoFreeGPUError):
        zero.acquire()


def test_warm_spares_default_to_one_per_slot_found(channel: WorkerChannel, tmp_path: Path) -> None:
    pool = SlotPool(slots=2)
    spares = SparePool(None, [sys.executable], channel.path, tmp_path, pool, channel)
    assert spares.count == 2
    pool.use(["0", "1", "2"])  # the agent found three GPUs
    assert spares.count == 3
    assert SparePool(1, [sys.executable], channel.path, tmp_path, pool, channel).count == 1


# --- the agent: slots checked once the devices are known -----------------------------------


@contextlib.asynccontextmanager
async def running_agent(agent: Agent) -> AsyncIterator[asyncio.Task[None]]:
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def registered(state: StateStore, agent: Agent) -> NodeRecord:
    async with asyncio.timeout(60):  # the agent imports torch for its store first
        while True:
            node = await state.get_node(NODE)
            if node is not None and node.boot_id == agent.boot_id:
                return node
            await asyncio.sleep(0.05)


@pytest.mark.parametrize(("asked", "slots"), [(None, 3), (1, 1)])
async def test_the_node_registers_the_slots_its_gpus_give(
    bus: Bus,
    state: StateStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    asked: int | None,
    slots: int,
) -> None:
    monkeypatch.setattr(agent_module, "visible_devices", lambda: ["0", "1", "2"])
    settings = AgentSettings(
        node_id=NODE, data_dir=tmp_path, spares=0, slots=asked, checkpoint_mirror_s=0
    )
    node = Agent(settings, bus, state)
    async with running_agent(node):
        record = await registered(state, node)
    assert (record.slots, record.gpus) == (slots, 3)
    assert node.slots.devices == ["0", "1", "2"][:slots]


async def test_an_agent_asked_for_more_slots_than_gpus_stops_at_start_with_exit_2(
    bus: Bus, state: StateStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_module, "visible_devices", lambda: ["0", "1"])
    settings = AgentSettings(node_id=NODE, data_dir=tmp_path, spares=0, slots=4)
    with pytest.raises(SlotsError, match=r"UNICRON_SLOTS=4 is more than the 2 GPU\(s\)"):
        await asyncio.wait_for(Agent(settings, bus, state).run(asyncio.Event()), timeout=60)
    assert await state.get_node(NODE) is None  # it never registered
    with pytest.raises(SystemExit) as exited:
        await run(bus, state, asyncio.Event(), settings)
    assert exited.value.code == 2


# --- workers: never a shared device ------------------------------------------------------


async def test_a_third_start_on_a_two_gpu_node_is_a_launch_failure_naming_the_reason(
    supervisor: Supervisor, sink: RecordingSink
) -> None:
    supervisor.slots.use(["3", "5"])
    for rank in (0, 1):
        await supervisor.start_worker(*start_cmd("job-g", "hang", rank=rank))
        await sink.next(WorkerStarted)
    await supervisor.start_worker(*start_cmd("job-h", "hang", rank=0))
    failure = await sink.next(WorkerException)
    assert (failure.job_id, failure.rank, failure.exc_type) == ("job-h", 0, "NoFreeGPUError")
    assert failure.message == (
        "no free GPU on node n1: 2 GPU(s), all held by job job-g rank 0 (generation 1), "
        "job job-g rank 1 (generation 1)"
    )
    # not the job's code and not for good: the job recovers from it within its recoveries
    assert failure.category == FailureCategory.EXITED_ABNORMALLY and not failure.launch_failed
    exited = await sink.next(WorkerExited)
    assert (exited.job_id, exited.pid, exited.exit_code) == ("job-h", 0, 1)
    assert [w.key.job_id for w in supervisor.live()] == ["job-g", "job-g"]


async def test_a_spare_takes_the_device_a_failed_rank_freed(
    supervisor: Supervisor, channel: WorkerChannel, sink: RecordingSink, tmp_path: Path
) -> None:
    supervisor.slots.use(["3", "5"])
    argv = EntrypointRegistry({"gpt": FAKE_WORKER}).argv("gpt")
    async with spare_pool(argv, supervisor, channel, tmp_path) as spares:
        for rank in (0, 1):
            await supervisor.start_worker(*start_cmd("job-s", "hang", rank=rank))
        started = await sink.next(WorkerStarted)
        await sink.next(WorkerStarted)
        await until(lambda: len(spares.ready()) == 1)
        assert supervisor.slots.free() == 0  # the waiting spare holds no device
        waiting = spares.ready()[0]
        await supervisor.start_worker(*start_cmd("job-s", "hang", rank=2))
        assert (await sink.next(WorkerException)).exc_type == "NoFreeGPUError"
        assert spares.ready() == [waiting]  # a refused start leaves the spare waiting

        rank_0 = supervisor.log_path(WorkerKey("job-s", 1, started.rank))
        await until(lambda: cuda_visible(rank_0) == "3")  # the first start took the first GPU
        os.kill(started.pid, signal.SIGKILL)
        await sink.next(WorkerExited)
        await until(lambda: supervisor.slots.free() == 1)
        await supervisor.start_worker(*start_cmd("job-s", "hang", generation=2, rank=2))
        joiner = await sink.next(WorkerStarted)
        assert joiner.pid == waiting.proc.pid  # the spare became the rank …
        log = supervisor.log_path(WorkerKey("job-s", 2, 2))
        await until(lambda: cuda_visible(log) == "3")  # … on the device rank 0 freed
        assert supervisor.slots.free() == 0


def test_each_worker_sees_exactly_its_device_as_local_rank_0() -> None:
    cmd, ctx = plain_start("job-l", [sys.executable, "train.py"], rank=3)  # local rank 1 of 2
    registry = EntrypointRegistry({})
    socket = Path("/tmp/agent.sock")
    _argv, env, _cwd = process_launch(
        cmd, ctx, node_id=NODE, socket=socket, registry=registry, slot_env={}
    )
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == ("1", "2", "1")
    pool = SlotPool(["4", "6"])
    _argv, env, _cwd = process_launch(
        cmd, ctx, node_id=NODE, socket=socket, registry=registry,
        slot_env=pool.env(pool.acquire()),
    )  # fmt: skip
    # cuda:LOCAL_RANK is its own device, as torchrun's lone worker of a one-GPU machine
    assert env["CUDA_VISIBLE_DEVICES"] == "4"
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == ("0", "1", "3")
    assert (env["RANK"], env["WORLD_SIZE"]) == ("3", "4")
    assert env["OMP_NUM_THREADS"] == "1"  # two ranks still share the machine's cores
