"""The local channel: reports reach the agent in order and soon, directives reach the worker,
and training is never held up by an agent that is absent or restarting."""

from __future__ import annotations

import queue
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from unicron.shared.contracts.messages import FaultKind, FaultSpec
from unicron.shared.contracts.reports import (
    WORKER_REPORT,
    StepCompleted,
    WorkerException,
    WorkerPhase,
)
from unicron.shared.contracts.workerchannel import AnyWorkerDirective, FaultDirective
from unicron.trainer import channel as channel_module
from unicron.trainer.channel import AgentChannel, Deferred

from tests.trainer.harness import AgentStandIn


def step_report(step: int) -> StepCompleted:
    return StepCompleted(
        node_id="n", job_id="j", generation=1, rank=0, step=step, loss=1.0, iteration_s=0.1
    )


def phase_report(step: int) -> WorkerPhase:
    return WorkerPhase(node_id="n", job_id="j", generation=1, rank=0, phase="compute", step=step)


def exception_report() -> WorkerException:
    return WorkerException(
        node_id="n", job_id="j", generation=1, rank=0, pid=1, exc_type="E", message="", category=""
    )


@pytest.fixture
def socket_path() -> Iterator[str]:
    with tempfile.TemporaryDirectory(dir="/tmp") as scratch:
        yield str(Path(scratch) / "agent.sock")


def test_reports_arrive_as_json_lines_and_directives_come_back(socket_path: str) -> None:
    agent = AgentStandIn(socket_path)
    directives: queue.Queue[AnyWorkerDirective] = queue.Queue()
    channel = AgentChannel(socket_path, on_directive=directives.put)
    try:
        for step in (1, 2):
            channel.send(step_report(step))
        assert channel.flush(5.0)
        received = [WORKER_REPORT.validate_python(agent.next()) for _ in range(2)]
        assert [r.step for r in received if isinstance(r, StepCompleted)] == [1, 2]

        conn = agent.connections.get(timeout=5)
        fault = FaultDirective(fault=FaultSpec(rank=0, kind=FaultKind.CRASH, at_step=3))
        line = fault.model_dump_json().encode()
        conn.sendall(b'not json\n[1, 2]\n{"directive": "raise"}\n' + line[:7])
        conn.sendall(line[7:] + b"\n")  # a line split across two writes
        assert directives.get(timeout=5) == fault  # the lines before it were dropped
        assert directives.empty()
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


def test_a_report_reaches_the_agent_within_the_latency_budget(socket_path: str) -> None:
    agent = AgentStandIn(socket_path)
    channel = AgentChannel(socket_path)
    try:
        for step in range(1, 4):
            began = time.monotonic()
            channel.send(step_report(step))
            assert agent.next(timeout_s=5.0)["step"] == step
            # The writer's tick is 10 ms; the rest is slack for a loaded test machine.
            assert time.monotonic() - began < 0.5
    finally:
        channel.close()
        agent.close()


def test_a_report_wakes_a_writer_that_stopped_ticking(
    socket_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel_module, "_IDLE_AFTER_S", 0.0)
    agent = AgentStandIn(socket_path)
    channel = AgentChannel(socket_path)
    try:
        deadline = time.monotonic() + 5.0
        while not channel._idle:  # the first empty tick puts it to sleep without a timer
            assert time.monotonic() < deadline
            time.sleep(0.001)
        channel.send(step_report(7))
        assert agent.next(timeout_s=5.0)["step"] == 7
    finally:
        channel.close()
        agent.close()


def test_routine_reports_wait_for_the_tick_and_an_urgent_one_takes_them_along(
    socket_path: str,
) -> None:
    agent = AgentStandIn(socket_path)
    channel = AgentChannel(socket_path, batch_s=60.0)  # a tick that never comes in this test
    try:
        channel.send(phase_report(1))
        channel.send(step_report(1))
        with pytest.raises(queue.Empty):
            agent.next(timeout_s=0.2)
        channel.send(exception_report())
        channel.send(step_report(2), urgent=True)
        got = [agent.next(timeout_s=5.0) for _ in range(3)]
        assert [m["kind"] for m in got] == ["step_completed", "worker_exception", "step_completed"]
        assert [m.get("step") for m in got] == [1, None, 2]
        assert agent.local.get(timeout=5.0)["kind"] == "worker_phase"  # sent before step 1

        channel.send(step_report(3))
        assert channel.flush(5.0)  # flush does not wait for the tick either
        assert agent.next(timeout_s=5.0)["step"] == 3
    finally:
        channel.close()
        agent.close()


def test_many_reports_arrive_in_order(socket_path: str) -> None:
    agent = AgentStandIn(socket_path)
    channel = AgentChannel(socket_path)
    try:
        for step in range(1, 501):
            channel.send(step_report(step) if step % 2 else phase_report(step))
            if step % 100 == 0:
                channel.send(exception_report())  # urgent ones in between flush mid-stream
        assert channel.flush(10.0)
        got = [agent.next() for _ in range(250 + 5)]
        steps = [m["step"] for m in got if m["kind"] == "step_completed"]
        assert steps == list(range(1, 501, 2))
        assert [i for i, m in enumerate(got) if m["kind"] == "worker_exception"] == [
            50,
            101,
            152,
            203,
            254,
        ]
        assert [agent.local.get(timeout=5.0)["step"] for _ in range(250)] == list(range(2, 501, 2))
        assert channel.dropped == 0
    finally:
        channel.close()
        agent.close()


def test_drops_are_still_counted_once_the_writer_took_the_rest(socket_path: str) -> None:
    channel = AgentChannel(socket_path, queue_limit=8)
    try:
        for step in range(1, 21):
            channel.send(step_report(step))
        agent = AgentStandIn(socket_path)
        assert channel.flush(10.0)
        assert channel.dropped == 12
        assert [agent.next()["step"] for _ in range(8)] == list(range(13, 21))
        agent.close()
    finally:
        channel.close()


def test_a_deferred_report_is_built_by_the_writer_into_the_models_own_line(
    socket_path: str,
) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    server.listen()
    channel = AgentChannel(socket_path, batch_s=60.0)  # a tick that never comes in this test
    who = {"node_id": "n", "job_id": "j", "generation": 1, "rank": 0}
    try:
        channel.send(exception_report())  # urgent: the writer connects and sends it now
        conn, _ = server.accept()
        with conn:
            conn.settimeout(5.0)
            assert b"worker_exception" in read_line(conn)
            direct = StepCompleted(**who, at=5.25, step=3, loss=1.0, iteration_s=0.5)
            channel.send(Deferred(StepCompleted, **who, at=5.25, step=3, loss=1.0, iteration_s=0.5))
            channel.send(direct)
            conn.settimeout(0.2)
            with pytest.raises(TimeoutError):  # routine: it waits for the tick
                conn.recv(1)
            conn.settimeout(5.0)
            assert channel.flush(5.0)
            line = direct.model_dump_json().encode() + b"\n"
            assert [read_line(conn), read_line(conn)] == [line, line]
    finally:
        channel.close()
        server.close()


def read_line(conn: socket.socket) -> bytes:
    """One line from ``conn``, newline included, read a byte at a time so nothing is held."""
    got = b""
    while not got.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            break
        got += chunk
    return got


def test_a_deferred_report_that_fails_to_build_is_dropped_alone(socket_path: str) -> None:
    agent = AgentStandIn(socket_path)
    channel = AgentChannel(socket_path)
    try:
        channel.send(Deferred(StepCompleted, node_id="n", step="not a step"))
        channel.send(step_report(2))
        assert channel.flush(5.0)
        assert agent.next(timeout_s=5.0)["step"] == 2
    finally:
        channel.close()
        agent.close()
