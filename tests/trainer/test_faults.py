"""Fault drills in real worker processes: each kind strikes at the step it was aimed at.

The test holds the rendezvous store back until the directive is in the worker's socket, so the
worker cannot have started training before it knew of the fault.
"""

from __future__ import annotations

import queue
import signal
import statistics
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from unicron.shared.contracts.messages import FaultKind, FaultSpec
from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.shared.contracts.workerchannel import FaultDirective
from unicron.trainer.faults import FaultInbox

from tests.trainer.harness import (
    DISCONNECTED,
    AgentStandIn,
    agent_and_held_store,
    make_launch,
    make_spec,
    spawn,
)

Reports = list[dict[str, Any]]


def directive(kind: FaultKind, at_step: int, rank: int = 0, **fields: Any) -> dict[str, Any]:
    fault = FaultSpec(rank=rank, kind=kind, at_step=at_step, **fields)
    return FaultDirective(fault=fault).model_dump(mode="json")


@contextmanager
def drilled(
    steps: int, lines: list[tuple[int, bytes | dict[str, Any]]], world: int = 1, **spec_fields: Any
) -> Iterator[tuple[AgentStandIn, list[subprocess.Popen[bytes]]]]:
    """Workers that get ``(rank, line)`` directives before they may start training."""
    spec = make_spec(steps=steps, checkpoint_every=1000, **spec_fields)
    with agent_and_held_store() as (agent, rendezvous, scratch, store):
        procs = [
            spawn(make_launch(spec, rendezvous, agent, scratch / "ck", rank, world))
            for rank in range(world)
        ]
        try:
            for rank, line in lines:
                agent.send(line, rank=rank)  # waits for that rank's hello
            store.start()
            yield agent, procs
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    proc.communicate()


def ended(agent: AgentStandIn, proc: subprocess.Popen[bytes]) -> tuple[int, str, Reports]:
    """Exit code, stderr and every forwarded report of a single worker that runs to its end."""
    _, err = proc.communicate(timeout=60)
    agent.collect(lambda got: bool(got) and got[-1]["kind"] == DISCONNECTED, local=True)
    reports = []
    while not agent.lines.empty():  # its connection is closed: every line it sent is in
        reports.append(agent.lines.get())
    return proc.returncode, err.decode(errors="replace"), reports


def of(reports: Reports, kind: str) -> Reports:
    return [r for r in reports if r["kind"] == kind]


def test_the_inbox_hands_each_fault_over_once_at_its_step() -> None:
    inbox = FaultInbox(rank=0)
    inbox.offer(FaultSpec(rank=0, kind=FaultKind.SLOW, at_step=5, slowdown=2.0))
    inbox.offer(FaultSpec(rank=0, kind=FaultKind.EXIT))
    assert [f.kind for f in inbox.due(3)] == [FaultKind.EXIT]  # no step given: the next one
    assert inbox.due(4) == []
    assert [f.kind for f in inbox.due(6)] == [FaultKind.SLOW]  # arrived late: fires at once
    assert inbox.due(7) == []


def test_crash_kills_the_worker_with_sigkill_at_its_step_without_a_report() -> None:
    with drilled(40, [(0, directive(FaultKind.CRASH, at_step=3))]) as (agent, (proc,)):
        code, err, reports = ended(agent, proc)
    assert code == -signal.SIGKILL
    assert not of(reports, "worker_exception")
    assert all(r["step"] < 3 for r in of(reports, "step_completed"))
    assert "fault injected" in err and "kind=crash" in err and "step=3" in err


def test_exit_leaves_with_its_code_at_its_step_without_a_report() -> None:
    with drilled(40, [(0, directive(FaultKind.EXIT, at_step=3, exit_code=7))]) as (agent, (p,)):
        code, err, reports = ended(agent, p)
    assert code == 7
    assert not of(reports, "worker_exception")
    assert all(r["step"] < 3 for r in of(reports, "step_completed"))
    assert "fault injected" in err and "kind=exit" in err and "step=3" in err


def test_an_injected_exception_is_classified_and_reported_like_a_real_fault() -> None:
    message = "CUDA error: an illegal memory access was encountered"
    drill = directive(FaultKind.EXCEPTION, at_step=3, message=message)
    with drilled(40, [(0, drill)]) as (agent, (proc,)):
        code, _, reports = ended(agent, proc)
    assert code == 1
    (failure,) = of(reports, "worker_exception")
    assert failure["category"] == FailureCategory.ILLEGAL_MEMORY.value
    assert failure["message"] == message and failure["exc_type"] == "RuntimeError"
    assert failure["step"] == 3 and failure["pid"] == proc.pid
    assert [r["step"] for r in of(reports, "step_completed")] == [1, 2]


def test_a_hung_rank_stops_in_compute_while_its_peer_waits_in_the_collective() -> None:
    with drilled(200, [(1, directive(FaultKind.HANG, at_step=4, rank=1))], world=2) as (
        agent,
        procs,
    ):
        done = agent.collect(lambda got: len(got) == 2 * 3, timeout_s=60)
        phases = agent.collect(
            lambda got: (
                {("compute", 1), ("collective", 0)}
                <= {(p["phase"], p["rank"]) for p in got if p.get("step") == 4}
            ),
            local=True,
        )
        mean = statistics.fmean(r["iteration_s"] for r in done)
        window = max(10 * mean, 0.5)
        try:
            late = agent.lines.get(timeout=window)
        except queue.Empty:
            late = None
        assert late is None, f"a report after the hang: {late}"
        assert all(proc.poll() is None for proc in procs)  # alive, just not progressing
        while not agent.local.empty():
            phases.append(agent.local.get())

    assert sorted((r["rank"], r["step"]) for r in done) == [
        (k, s) for k in (0, 1) for s in (1, 2, 3)
    ]
    # Each rank's phases arrive in the order it sent them; the last one is where it is now.
    last = {
        rank: [(p["phase"], p["step"]) for p in phases if p.get("phase") and p["rank"] == rank][-1]
        for rank in (0, 1)
    }
    assert last == {0: ("collective", 4), 1: ("compute", 4)}


def test_a_slow_rank_computes_slowdown_times_longer_from_its_step() -> None:
    slow = directive(FaultKind.SLOW, at_step=13, slowdown=3.0)
    # Larger micro-batches than the other drills: ~20 ms steps, so scheduler jitter is small.
    with drilled(24, [(0, slow)], global_batch=32, micro_batch=8) as (agent, (p,)):
        code, _, reports = ended(agent, p)
    assert code == 0
    steps = of(reports, "step_completed")
    assert [r["step"] for r in steps] == list(range(1, 25))
    assert all(0 < r["compute_s"] <= r["iteration_s"] for r in steps)
    # The least disturbed step of two equal, adjacent stretches: other load on the machine only
    # adds time, and equal sample sizes keep the minimum of the longer stretch from winning.
    before = min(r["compute_s"] for r in steps[5:12])  # steps 6..12, caches warm by then
    after = min(r["compute_s"] for r in steps[12:19])  # steps 13..19, slowed
    # Short steps on a shared machine: wide bounds, still far from 1x (no slowdown).
    assert 1.8 < after / before < 5.0, (before, after)


def test_malformed_directives_are_ignored_and_training_goes_on() -> None:
    garbage: list[bytes | dict[str, Any]] = [
        b"not json",
        b"[1, 2]",
        {"directive": "fault"},
        {"directive": "fault", "fault": {"rank": 0, "kind": "explode"}},
        {"directive": "fault", "fault": {"rank": 0, "kind": "exit", "slowdown": 3}},
        directive(FaultKind.CRASH, at_step=2, rank=1),  # another rank's
        {"directive": "drain"},
    ]
    with drilled(30, [(0, line) for line in garbage]) as (agent, (proc,)):
        agent.collect(lambda got: any(r["step"] == 2 for r in got if "step" in r))
        agent.send(b'{"directive": "fault", "fault": {"rank": 0, "kind": "hang", "at_step"')
        code, err, reports = ended(agent, proc)
    assert code == 0
    assert [r["step"] for r in of(reports, "step_completed")][-1] == 30
    assert err.count("agent sent a line that is not a directive") == 7  # all but the valid one
    assert "fault for another rank ignored" in err
