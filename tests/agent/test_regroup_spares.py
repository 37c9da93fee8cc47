"""In-place regroups delivered to live workers, and warm spares that serve starts.

The stdlib fake worker (``tests/agent/fake_worker.py``) plays the worker side of both
protocols; everything is awaited with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from unicron.services.agent.agent import Agent
from unicron.services.agent.channel import WorkerChannel
from unicron.services.agent.hang import HangWatch
from unicron.services.agent.registry import EntrypointRegistry
from unicron.services.agent.regroup import Regrouper
from unicron.services.agent.settings import AgentSettings
from unicron.services.agent.spares import SparePool
from unicron.services.agent.supervisor import CommandRejectedError, Supervisor, WorkerKey
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.messages import (
    DeadLetter,
    RegroupDirective,
    RegroupWorker,
    Rendezvous,
    StopWorkers,
    command_subject,
)
from unicron.shared.contracts.reports import (
    StepCompleted,
    WorkerExited,
    WorkerRegrouped,
    WorkerStarted,
)
from unicron.shared.contracts.workerchannel import WorkerLaunch
from unicron.shared.store.state import StateStore

from tests.agent.conftest import RecordingSink, directives, spare_pool, start_cmd, until
from tests.agent.process import FAKE_WORKER, NODE, inbox

STEPPER = "step-20-40-40-0"


def regroup(
    job: str, from_gen: int, from_rank: int, gen: int, rank: int, world: int
) -> RegroupWorker:
    rendezvous = Rendezvous(host="127.0.0.1", port=29500, prefix=f"{job}/g{gen}/")
    directive = RegroupDirective(
        job_id=job, generation=gen, rank=rank, world_size=world, rendezvous=rendezvous
    )
    return RegroupWorker(
        job_id=job, from_generation=from_gen, from_rank=from_rank, directive=directive
    )


async def test_regroup_reaches_the_worker_and_rekeys_it(
    supervisor: Supervisor, channel: WorkerChannel, sink: RecordingSink, watch: HangWatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    regroups = Regrouper(channel, supervisor, on_regroup=watch.regrouped)
    await supervisor.start_worker(*start_cmd("job-a", STEPPER, generation=1, rank=2, steps=10_000))
    started = await sink.next(WorkerStarted)
    await sink.next(StepCompleted)  # its channel is connected

    cmd = regroup("job-a", 1, 2, gen=2, rank=0, world=2)
    await regroups.regroup(cmd)
    done = await sink.next(WorkerRegrouped)
    assert (done.generation, done.rank, done.world_size, done.pid) == (2, 0, 2, started.pid)
    step = await sink.next(StepCompleted)
    assert (step.generation, step.rank) == (2, 0)
    worker = supervisor.find(WorkerKey("job-a", 2, 0))
    assert worker is not None and worker.proc.pid == started.pid
    assert watch._tracks[worker.key].ident == WorkerKey("job-a", 2, 0)  # hang reports: new name

    # redelivered: nothing sent twice; a stop of the old generation spares the re-formed worker
    await regroups.regroup(cmd.model_copy(update={"command_id": "cmd-again"}))
    await supervisor.stop_workers(StopWorkers(job_id="job-a", below_generation=2))
    assert worker.alive
    log = tmp_path / "logs" / "job-a" / "g1-r2.log"
    await until(lambda: len(directives(log)) >= 1)
    (sent,) = directives(log)
    assert isinstance(sent, RegroupDirective) and sent.generation == 2

    # a worker this node does not run cannot be regrouped
    with pytest.raises(CommandRejectedError, match="no live worker job-a g1 r1"):
        await regroups.regroup(regroup("job-a", 1, 1, gen=2, rank=1, world=2))

    # its exit speaks for who it is now
    os.kill(started.pid, signal.SIGKILL)
    exited = await sink.next(WorkerExited)
    assert (exited.generation, exited.rank, exited.signal) == (2, 0, signal.SIGKILL)


async def test_agent_dead_letters_a_regroup_for_an_unknown_worker(
    bus: Bus, state: StateStore, tmp_path: Path
) -> None:
    letters = await inbox(bus, "unicron.deadletter", DeadLetter.model_validate_json)
    node = Agent(AgentSettings(node_id=NODE, data_dir=tmp_path, spares=0), bus, state)
    node.outbox.start()
    try:
        await node.handle(regroup("job-z", 3, 1, gen=4, rank=0, world=1))
        letter = await letters.report(DeadLetter, subject=command_subject(NODE))
        assert "no live worker job-z g3 r1" in letter.reason
    finally:
        await node.outbox.close()


@pytest.fixture
async def spares(
    supervisor: Supervisor, channel: WorkerChannel, tmp_path: Path
) -> AsyncIterator[SparePool]:
    argv = EntrypointRegistry({"gpt": FAKE_WORKER}).argv("gpt")
    async with spare_pool(argv, supervisor, channel, tmp_path) as pool:
        yield pool


async def test_a_start_is_served_by_a_warm_spare_which_is_replaced(
    supervisor: Supervisor, spares: SparePool, sink: RecordingSink, tmp_path: Path
) -> None:
    await until(lambda: len(spares.ready()) == 1)
    spare = spares.ready()[0]
    cmd, ctx = start_cmd("job-s", "hang", steps=3)
    await supervisor.start_worker(cmd, ctx)
    # The served spare may step before the agent reports it started (the launch reached it
    # before the serve returned), so its reports are taken in whatever order they come.
    got = await sink.gather(WorkerStarted, StepCompleted, StepCompleted, StepCompleted)
    started = next(r for r in got if isinstance(r, WorkerStarted))
    assert started.pid == spare.proc.pid and spares.served == 1
    assert sorted(r.step for r in got if isinstance(r, StepCompleted)) == [0, 1, 2]
    log = tmp_path / "logs" / "job-s" / "g1-r0.log"
    launch = WorkerLaunch.model_validate_json(log.read_text().splitlines()[0])
    assert (launch.job_id, launch.rendezvous) == ("job-s", cmd.rendezvous)
    # the spare was told to run the job's registered trainer, as a spawn would have
    assert f"served by spare {json.dumps(supervisor.registry.argv('gpt'))}" in log.read_text()

    # another spare takes its place; one that dies is replaced; neither is a worker
    await until(lambda: len(spares.ready()) == 1 and spares.ready()[0] is not spare)
    second = spares.ready()[0]
    os.kill(second.proc.pid, signal.SIGKILL)
    await until(lambda: len(spares.ready()) == 1 and spares.ready()[0] is not second)
    assert [w.proc.pid for w in supervisor.live()] == [started.pid]

    await spares.close()
    assert spares.waiting() == []


async def test_spares_give_up_when_the_trainer_cannot_wait(
    supervisor: Supervisor, channel: WorkerChannel, tmp_path: Path
) -> None:
    argv = [sys.executable, "-c", "pass"]
    pool = SparePool(1, argv, channel.path, tmp_path, supervisor.slots, channel)
    pool.start()
    try:
        await until(lambda: not pool.enabled)
        assert pool.claim() is None  # every start spawns
    finally:
        await pool.close()
