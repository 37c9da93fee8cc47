"""The agent process against real NATS and Redis: hangs on the bus, fault drills, and a
quarantine that outlives a restart. Everything is awaited with a deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import NodeJoined
from unicron.shared.contracts.messages import (
    DeadLetter,
    FaultKind,
    FaultSpec,
    InjectFault,
    command_subject,
)
from unicron.shared.contracts.models import NodeRecord, NodeState, now
from unicron.shared.contracts.reports import (
    StepCompleted,
    WorkerExited,
    WorkerHung,
    WorkerPhase,
    WorkerStarted,
)
from unicron.shared.contracts.workerchannel import FaultDirective
from unicron.shared.store.state import StateStore

from tests.agent.conftest import directives, send_start, start_cmd, until
from tests.agent.process import NODE, Heard, node_record

STEPPER = "step-20-40-40-0"


@pytest.fixture
async def quarantined(state: StateStore) -> NodeRecord:
    """What the node's earlier boot left: a quarantine an operator set, an hour to go."""
    old = NodeRecord(
        id=NODE, state=NodeState.QUARANTINED, quarantined_until=now() + 3600, slots=4,
        boot_id="old", store_port=1,
    )  # fmt: skip
    await state.put_node(old)
    return old


async def test_agent_reports_hangs_and_runs_drills(
    quarantined: NodeRecord,
    bus: Bus,
    state: StateStore,
    agent: subprocess.Popen[bytes],
    joined: NodeJoined,
    heard: Heard,
    tmp_path: Path,
) -> None:
    reports, letters = heard

    # the restart took the record over but did not lift the quarantine
    node = await node_record(state, lambda n: n.boot_id == joined.boot_id)
    assert node.state == NodeState.QUARANTINED
    assert node.quarantined_until == quarantined.quarantined_until

    # a SIGSTOPped worker never exits, but it stops stepping: hung, in state T
    for job in ("job-s", "job-f"):
        await send_start(bus, state, start_cmd(job, STEPPER, steps=10_000))
    stopped = await reports.report(WorkerStarted, job_id="job-s")
    for _ in range(10):
        await reports.report(StepCompleted, job_id="job-s")
    os.kill(stopped.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    hung = await reports.report(WorkerHung, job_id="job-s", within=5)
    print(
        f"SIGSTOP → WorkerHung on the bus: {(time.monotonic() - stopped_at) * 1000:.0f} ms "
        f"(threshold {hung.threshold_s * 1000:.0f} ms)"
    )
    assert (hung.pid, hung.process_state, hung.generation, hung.rank) == (stopped.pid, "T", 1, 0)
    assert hung.last_step is not None and hung.last_step >= 9
    assert not [r for r in reports.seen if isinstance(r, WorkerExited)]

    # a fault the API did not mark as a drill (a forged command) is refused, and the worker
    # is undisturbed; the marked drill that follows is the only one it sees
    drill = FaultSpec(rank=0, kind=FaultKind.HANG)
    forged = InjectFault(job_id="job-f", generation=1, rank=0, fault=drill)
    await bus.send_command(NODE, forged)
    refused = await letters.report(DeadLetter, subject=command_subject(NODE))
    assert "not a drill the API marked" in refused.reason
    marked = InjectFault(job_id="job-f", generation=1, rank=0, fault=drill)
    await state.mark_drill("job-f", 1, marked.command_id, ttl_s=60)
    await bus.send_command(NODE, marked)
    hung_f = await reports.report(WorkerHung, job_id="job-f", within=5)
    assert (hung_f.phase, hung_f.process_state) == ("compute", "S")
    log = tmp_path / "data" / "logs" / "job-f" / "g1-r0.log"
    await until(lambda: directives(log) != [])
    assert directives(log) == [FaultDirective(fault=drill)]

    # a drill for a worker this node does not run is dead-lettered, with the reason
    elsewhere = InjectFault(job_id="job-x", generation=1, rank=0, fault=drill)
    await state.mark_drill("job-x", 1, elsewhere.command_id, ttl_s=60)
    await bus.send_command(NODE, elsewhere)
    letter = await letters.report(DeadLetter, subject=command_subject(NODE))
    assert "no live worker job-x g1 r0" in letter.reason

    # phases stay on the node; reports go out in order, so any would have arrived by now
    assert not [r for r in reports.seen if isinstance(r, WorkerPhase)]
    assert [r.job_id for r in reports.seen if isinstance(r, WorkerHung)] == ["job-s", "job-f"]
    os.kill(stopped.pid, signal.SIGKILL)  # a stopped process still dies, and is reported
    assert (await reports.report(WorkerExited, job_id="job-s")).signal == signal.SIGKILL
