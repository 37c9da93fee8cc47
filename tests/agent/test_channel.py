"""The local channel forwards worker reports, rejects bad lines, and reaches one worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from unicron.services.agent.channel import WorkerChannel
from unicron.services.agent.supervisor import Supervisor, WorkerKey
from unicron.shared.contracts.messages import FaultKind, FaultSpec
from unicron.shared.contracts.reports import StepCompleted, WorkerExited, WorkerHung, WorkerPhase
from unicron.shared.contracts.workerchannel import FaultDirective, parse_directive
from unicron.trainer.channel import AgentChannel

from tests.agent.conftest import RecordingSink, start_cmd, until

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def drill(kind: FaultKind = FaultKind.SLOW, **fields: object) -> FaultDirective:
    return FaultDirective(fault=FaultSpec.model_validate({"rank": 0, "kind": kind, **fields}))


def step(step: int, node: str = "n1", job: str = "job-a", gen: int = 1) -> bytes:
    report = StepCompleted(
        node_id=node, job_id=job, generation=gen, rank=0, step=step, loss=0.5, iteration_s=0.1
    )
    return report.model_dump_json().encode() + b"\n"


@pytest.fixture
async def conn(channel: WorkerChannel) -> AsyncIterator[Conn]:
    reader, writer = await asyncio.open_unix_connection(str(channel.path))
    yield reader, writer
    writer.close()


async def test_reports_are_forwarded_and_bad_lines_dead_lettered(
    channel: WorkerChannel, sink: RecordingSink, conn: Conn
) -> None:
    _, writer = conn
    writer.write(step(1) + b"{not json\n" + step(2, node="other") + b"\n" + step(3))
    await writer.drain()
    assert [(await sink.next(StepCompleted)).step for _ in range(2)] == [1, 3]
    reasons = [(await sink.letters.get())[2] for _ in range(2)]
    assert reasons[0].startswith("invalid report")
    assert "for node 'other'" in reasons[1]


async def test_phases_stay_on_the_node_and_agent_reports_are_refused(
    channel: WorkerChannel, sink: RecordingSink, conn: Conn
) -> None:
    observed: list[str] = []
    channel.observe = lambda _key, report: observed.append(report.kind)
    ids = {"node_id": "n1", "job_id": "job-a", "generation": 1, "rank": 0}
    phase = WorkerPhase(**ids, phase="compute", step=2)
    forged = WorkerHung(
        **ids, pid=1, silent_s=9, threshold_s=1, mean_iteration_s=None, process_state="R"
    )
    _, writer = conn
    for report in (phase, forged):
        writer.write(report.model_dump_json().encode() + b"\n")
    writer.write(step(2))
    await writer.drain()
    assert isinstance(await asyncio.wait_for(sink.reports.get(), 5), StepCompleted)
    assert "agent's to report" in (await asyncio.wait_for(sink.letters.get(), 5))[2]
    assert observed == ["worker_phase", "step_completed"]  # hang detection sees the phase
    assert sink.reports.empty()


async def test_directive_reaches_the_worker_that_reported(
    channel: WorkerChannel, sink: RecordingSink, conn: Conn
) -> None:
    reader, writer = conn
    first, second = drill(at_step=1), drill(at_step=2)
    assert not await channel.send_to_worker(WorkerKey("job-a", 1, 0), first)
    writer.write(b'{"kind": "hello", "job_id": "job-a", "generation": 1, "rank": 0}\n')
    writer.write(step(1, gen=2))  # re-formed in place: reachable under both generations
    await writer.drain()
    await sink.next(StepCompleted)
    assert await channel.send_to_worker(WorkerKey("job-a", 1, 0), first)
    assert await channel.send_to_worker(WorkerKey("job-a", 2, 0), second)
    lines = [parse_directive(await asyncio.wait_for(reader.readline(), 5)) for _ in range(2)]
    assert lines == [first, second]
    assert sink.letters.empty()  # the hello is not a report, and not an error either
    writer.close()
    await writer.wait_closed()
    await until(lambda: not channel.connected(WorkerKey("job-a", 1, 0)))
    assert not await channel.send_to_worker(WorkerKey("job-a", 1, 0), first)


async def test_launched_worker_is_known_by_its_pid(
    supervisor: Supervisor, channel: WorkerChannel, sink: RecordingSink
) -> None:
    """A worker the supervisor launched is reachable before it sends anything (``echo`` sends
    nothing unasked: it answers a drill for step S with a report, an exit drill by exiting)."""
    await supervisor.start_worker(*start_cmd("job-e", "echo", generation=3, rank=1))
    key = WorkerKey("job-e", 3, 1)
    await until(lambda: channel.connected(key))
    assert sink.reports.qsize() == 1  # only WorkerStarted: the pid alone identified it
    assert await channel.send_to_worker(key, drill(at_step=42))
    assert (await sink.next(StepCompleted)).step == 42
    assert await channel.send_to_worker(key, drill(FaultKind.EXIT, exit_code=7))
    assert (await sink.next(WorkerExited)).exit_code == 7


async def test_oversized_line_is_rejected_and_connection_lives(
    channel: WorkerChannel, sink: RecordingSink, conn: Conn
) -> None:
    _, writer = conn
    writer.write(b"x" * (2 << 20) + b"\n" + step(9))
    await writer.drain()
    assert (await sink.next(StepCompleted)).step == 9
    assert not sink.letters.empty()


async def test_a_workers_batched_reports_reach_the_bus_soon_and_in_order(
    channel: WorkerChannel, sink: RecordingSink
) -> None:
    """The worker's channel writes routine reports in batches on a 10 ms tick: each one must
    still be forwarded well within the agent's detection budget, in the order it was sent."""
    observed: list[WorkerPhase] = []
    channel.observe = lambda _key, r: observed.append(r) if isinstance(r, WorkerPhase) else None
    worker = AgentChannel(str(channel.path))
    ids = {"node_id": "n1", "job_id": "job-a", "generation": 1, "rank": 0}
    try:
        for n in range(1, 6):
            began = time.monotonic()
            worker.send(WorkerPhase(**ids, phase="compute", step=n))
            worker.send(StepCompleted(**ids, step=n, loss=0.5, iteration_s=0.1))
            assert (await sink.next(StepCompleted, within=5.0)).step == n
            # The tick is 10 ms; the rest is slack for a loaded test machine.
            assert time.monotonic() - began < 0.5
        assert [p.step for p in observed] == [1, 2, 3, 4, 5]  # each before its step's report
    finally:
        await asyncio.to_thread(worker.close)
