"""The agent's heartbeat lists the workers it runs, and a node whose record Redis lost comes
back on the next heartbeat with its slots and those workers (docs/design.md §6)."""

from __future__ import annotations

import subprocess

from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import NodeJoined
from unicron.shared.contracts.models import NodeWorker
from unicron.shared.contracts.reports import REPORT, WorkerStarted
from unicron.shared.store.state import StateStore

from tests.agent.conftest import send_start, start_cmd
from tests.agent.process import NODE, inbox, node_record


async def test_a_lost_node_record_comes_back_with_the_workers_it_runs(
    bus: Bus, state: StateStore, agent: subprocess.Popen[bytes], joined: NodeJoined
) -> None:
    reports = await inbox(bus, f"unicron.reports.{NODE}.>", REPORT.validate_json)
    await send_start(bus, state, start_cmd("job-a", "hang", generation=2, rank=1))
    started = await reports.report(WorkerStarted, job_id="job-a")
    runs = [NodeWorker(job_id="job-a", generation=2, rank=1, pid=started.pid)]
    await node_record(state, lambda n: n.workers == runs)

    await state.redis.flushdb()  # Redis lost its data: the job's record and the node's
    node = await node_record(state, lambda n: n.workers == runs)
    assert (node.boot_id, node.slots, node.used) == (joined.boot_id, 4, 1)
