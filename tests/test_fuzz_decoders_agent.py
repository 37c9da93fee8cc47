"""Fuzzing the agent's side of the worker channel (``WorkerChannel``; the inputs are
``tests/fuzzing.py``'s): a line is forwarded, bound as a hello or dead-lettered, never raises,
and a valid report still goes through after it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

from hypothesis import given
from hypothesis import strategies as st
from unicron.services.agent.channel import AGENT_ONLY, MAX_LINE, WorkerChannel, _Conn
from unicron.services.agent.outbox import Report
from unicron.services.agent.supervisor import WorkerKey
from unicron.shared.contracts.reports import StepCompleted, WorkerHello

from tests.fuzzing import (
    AGENT_LINES,
    AGENT_STREAM,
    ANY_INPUT,
    HELLOS,
    IDS,
    REPORTS,
    as_json,
    fuzz,
    near_valid,
    run,
)


class ListSink:
    def __init__(self) -> None:
        self.reports: list[Report] = []
        self.letters: list[tuple[str, bytes, str]] = []

    def report(self, report: Report) -> None:
        self.reports.append(report)

    def dead_letter(self, subject: str, payload: bytes, reason: str) -> None:
        self.letters.append((subject, payload, reason))


def agent_channel() -> tuple[WorkerChannel, ListSink, list[Report]]:
    sink = ListSink()
    observed: list[Report] = []
    channel = WorkerChannel(
        Path("/nonexistent/fuzz.sock"),
        "n1",
        sink,
        observe=lambda _key, report: observed.append(report),
    )
    return channel, sink, observed


WORKER_LINE_SEEDS = as_json(REPORTS) + as_json(HELLOS)
VALID_STEP = StepCompleted(**IDS, step=7, loss=0.1, iteration_s=0.1).model_dump_json().encode()


@fuzz(AGENT_LINES)
@given(
    line=st.one_of(ANY_INPUT, near_valid(WORKER_LINE_SEEDS)).map(bytes.strip),
    launched=st.sampled_from([None, WorkerKey("job-a", 1, 0), WorkerKey("job-b", 1, 0)]),
)
def test_the_agent_forwards_binds_or_dead_letters_each_line(
    line: bytes, launched: WorkerKey | None
) -> None:
    channel, sink, observed = agent_channel()
    conn = _Conn(cast(asyncio.StreamWriter, None), launched)
    if line:
        channel._on_line(line, conn)  # must not raise: that would drop the worker's connection
    outcomes = len(sink.letters) + len(observed)
    if outcomes == 0:  # the one line taken without a word: a hello, which binds the worker
        hello = WorkerHello.model_validate_json(line) if line else None
        assert hello is None or WorkerKey(hello.job_id, hello.generation, hello.rank) in conn.keys
    else:
        assert outcomes == 1
    for report in sink.reports:  # what reaches the bus speaks for this node, as a worker
        assert report.node_id == "n1" and not isinstance(report, AGENT_ONLY)
        assert launched is None or report.job_id == launched.job_id
    assert all(subject == "agent.n1.channel" for subject, _, _ in sink.letters)
    before = len(sink.reports)
    channel._on_line(VALID_STEP, conn)
    if launched is None or launched.job_id == "job-a":
        assert len(sink.reports) == before + 1


async def read_stream(channel: WorkerChannel, conn: _Conn, stream: bytes) -> None:
    reader = asyncio.StreamReader(limit=MAX_LINE)
    reader.feed_data(stream)
    reader.feed_eof()
    await channel._read_lines(reader, conn)


@fuzz(AGENT_STREAM)
@given(lines=st.lists(st.one_of(ANY_INPUT, near_valid(WORKER_LINE_SEEDS)), max_size=8))
def test_the_agent_reads_a_stream_of_bad_lines_to_its_end(lines: list[bytes]) -> None:
    channel, sink, _observed = agent_channel()
    conn = _Conn(cast(asyncio.StreamWriter, None), None)
    stream = b"\n".join(lines) + b"\n" + VALID_STEP  # the last, valid line has no newline
    run(read_stream(channel, conn, stream))
    assert sink.reports and sink.reports[-1].model_dump_json().encode() == VALID_STEP


def test_the_agent_refuses_a_line_over_the_limit_and_reads_on() -> None:
    channel, sink, _observed = agent_channel()
    conn = _Conn(cast(asyncio.StreamWriter, None), None)
    huge = b'{"kind": "step_completed", "x": "' + b"y" * MAX_LINE + b'"}\n'
    run(read_stream(channel, conn, huge + b"[" * (MAX_LINE + 10) + b"\n" + VALID_STEP))
    assert [reason for _, _, reason in sink.letters] == ["line longer than the limit"] * 2
    assert len(sink.reports) == 1
