"""The local channel: reports reach the agent, directives reach the worker, and training is
never held up by an agent that is absent or restarting."""

from __future__ import annotations

import queue
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.trainer.harness import AgentStandIn
from unicron.shared.reports import WORKER_REPORT, StepCompleted
from unicron.trainer.channel import AgentChannel, Directive


def step_report(step: int) -> StepCompleted:
    return StepCompleted(
        node_id="n", job_id="j", generation=1, rank=0, step=step, loss=1.0, iteration_s=0.1
    )


@pytest.fixture
def socket_path() -> Iterator[str]:
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        yield str(Path(scratch) / "agent.sock")


def test_reports_arrive_as_json_lines_and_directives_come_back(socket_path: str) -> None:
    agent = AgentStandIn(socket_path)
    directives: queue.Queue[Directive] = queue.Queue()
    channel = AgentChannel(socket_path, on_directive=directives.put)
    try:
        for step in (1, 2):
            channel.send(step_report(step))
        assert channel.flush(5.0)
        received = [WORKER_REPORT.validate_python(agent.next()) for _ in range(2)]
        assert [r.step for r in received if isinstance(r, StepCompleted)] == [1, 2]

        conn = agent.connections.get(timeout=5)
        conn.sendall(b'not json\n[1, 2]\n{"fault": "raise", "at_step": 3}\n{"a"')
        conn.sendall(b": 1}\n")
        assert directives.get(timeout=5) == {"fault": "raise", "at_step": 3}
        assert directives.get(timeout=5) == {"a": 1}
    finally:
        channel.close()
        agent.close()


def test_an_absent_agent_never_blocks_and_gets_the_newest_reports_when_it_comes(
    socket_path: str,
) -> None:
    channel = AgentChannel(socket_path, queue_limit=8)
    try:
        began = time.monotonic()
        for step in range(1, 101):
            channel.send(step_report(step))
        assert time.monotonic() - began < 1.0
        assert channel.dropped == 92
        assert not channel.flush(0.2)

        agent = AgentStandIn(socket_path)
        assert channel.flush(10.0)
        steps = [agent.next()["step"] for _ in range(8)]
        assert steps == list(range(93, 101))
        agent.close()
    finally:
        channel.close()


def test_reports_after_an_agent_restart_reach_the_new_agent(socket_path: str) -> None:
    first = AgentStandIn(socket_path)
    channel = AgentChannel(socket_path)
    try:
        channel.send(step_report(1))
        assert first.next()["step"] == 1
        first.close()
        Path(socket_path).unlink()

        second = AgentStandIn(socket_path)
        channel.send(step_report(2))
        channel.send(step_report(3))
        assert channel.flush(10.0)
        # A unix socket refuses writes once its peer is gone, so nothing is lost in between.
        assert [second.next()["step"] for _ in range(2)] == [2, 3]
        second.close()
    finally:
        channel.close()
