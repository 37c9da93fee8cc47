"""The control plane's half of an in-place restart against a real agent process and the
stdlib fake worker (which plays the worker side of the regroup protocol): the survivor keeps its
process, the joiner comes from a warm spare, and the transition completes in place."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

from unicron.services.executor.service import Executor
from unicron.shared.contracts.events import NodeJoined, TransitionCompleted
from unicron.shared.contracts.models import Job, JobState, PlanAction, WorkerState
from unicron.shared.store.state import StateStore

from tests.agent.process import NODE
from tests.executor.conftest import Events, apply, fail, job_where, spec


async def spare_ready(state: StateStore, after: float, within: float = 30) -> None:
    """Wait until a heartbeat sent after ``after`` says the node has a warm spare waiting."""
    async with asyncio.timeout(within):
        while True:  # node records have no push channel: polled from Redis, bounded
            node = await state.get_node(NODE)
            if node is not None and node.last_heartbeat > after and node.spares_ready >= 1:
                return
            await asyncio.sleep(0.05)


async def test_in_place_restart_through_a_real_agent(
    executor: Executor, state: StateStore, events: Events, agent: subprocess.Popen[bytes],
    joined: NodeJoined, tmp_path: Path,
) -> None:  # fmt: skip
    job = Job(id="job-e", name="e", spec=spec().model_copy(update={"name": "step-20-30-30-0"}))
    await state.create_job(job)
    await apply(executor, state, job, PlanAction.START, [NODE, NODE])
    running = await job_where(
        state, job.id, lambda j: j.state == JobState.RUNNING and j.stepping and j.step >= 3
    )
    survivor_pid = running.workers[0].pid
    victim = running.workers[1].pid
    assert survivor_pid and victim
    await spare_ready(state, after=time.time())  # the first start may have taken the last one
    os.kill(victim, signal.SIGKILL)
    await job_where(state, job.id, lambda j: j.workers[1].state == WorkerState.FAILED)
    failed = await fail(state, job.id, "restart", rank=1)
    await apply(executor, state, failed, PlanAction.RESTART, [NODE, NODE])

    done = await events.next(TransitionCompleted, within=30, job_id=job.id, generation=2)
    assert (done.kind, done.state_source, done.fallback) == ("in_place", "peer", None)
    assert {"regroup", "first_step"} <= set(done.phases)
    after = await job_where(state, job.id, lambda j: j.state == JobState.RUNNING)
    assert after.generation == 2 and after.workers[0].pid == survivor_pid
    assert after.workers[0].from_rank == 0 and after.workers[1].from_rank is None
    log = tmp_path / "data" / "logs" / job.id / "g2-r1.log"
    assert "served by spare" in log.read_text()  # the joiner was a warm spare, not a spawn
