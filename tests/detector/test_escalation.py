"""Escalation of repeated failures, quarantine of failing nodes, and fail-slow ranks."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import FailureRecord, Job, NodeState, now
from unicron.shared.contracts.reports import StepCompleted, WorkerException
from unicron.shared.store.state import StateStore

from tests.detector.conftest import Cluster, next_event, no_event
from tests.detector.test_correlation import exited, reset_by_peer


async def reset_after_a_reattempt(
    cluster: Cluster,
    bus: Bus,
    events: asyncio.Queue[CloudEvent],
    job_id: str,
    steps_since: int,
    generation: int = 2,
    **fields: object,
) -> dict[str, Any]:
    """A connection reset in ``generation`` (a field of the job record in ``fields``),
    ``steps_since`` steps after generation 1's SEV3 failure at step 40 was reattempted; the
    failure.detected it gives."""
    await cluster.add_node("node-0")
    earlier = FailureRecord(
        failure_id=f"{job_id}:1", generation=1, kind="exception", category="connection_reset",
        severity="SEV3", action="reattempt", observed_at=now() - 5, rank=0, node_id="node-0",
        step=40,
    )  # fmt: skip
    await cluster.add_job(
        job_id, ["node-0"] * 2, generation, last_failure=earlier, step=40 + steps_since, **fields
    )
    await bus.publish_report(reset_by_peer(job_id, 1, "node-0", gen=generation))
    return (await next_event(events, "failure.detected")).data


def ecc_error(node_id: str, job_id: str) -> WorkerException:
    """A SEV1 fault of the node's own hardware, as the worker runtime reports it."""
    return WorkerException(
        node_id=node_id, job_id=job_id, generation=1, rank=0, pid=1000,
        exc_type="RuntimeError", message="CUDA error: uncorrectable ECC error encountered",
        category="ecc",
    )  # fmt: skip


async def test_failure_after_a_reattempt_escalates_to_restart(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    # Generation 2 failed again two steps into its recovery: the reattempt did not help.
    failure = await reset_after_a_reattempt(cluster, bus, events, "job-h", steps_since=2)
    assert (failure["severity"], failure["action"]) == ("SEV2", "restart")
    assert failure["evidence"]["escalated_from"] == "reattempt"


@pytest.mark.parametrize(
    ("fallback", "escalated"), [("g2 r1 exited (signal 9)", True), (None, False)]
)
async def test_a_failure_of_the_restart_an_in_place_answer_fell_back_to_escalates(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], fallback: str | None,
    escalated: bool,
) -> None:  # fmt: skip
    # Generation 2 answered generation 1's failure in place, its survivor was gone too, and the
    # executor restarted every rank as generation 3: generation 3 failing is the same recovery
    # not holding. With no fallback, generation 3 came from something else (a resize).
    failure = await reset_after_a_reattempt(
        cluster, bus, events, f"job-f{escalated:d}", 2, generation=3, transition_fallback=fallback
    )
    assert ("escalated_from" in failure["evidence"]) is escalated
    assert failure["action"] == ("restart" if escalated else "reattempt")


async def test_a_survivor_dying_before_its_regroup_stepped_is_left_to_the_executor(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    # Both ranks were killed at once: generation 2 was to re-form around rank 1, whose exit is
    # generation 2's since the regroup went to it. The executor restarts every rank for that;
    # recording it too answered the fault twice and graded it up to a reconfigure.
    await cluster.add_node("node-0")
    earlier = FailureRecord(
        failure_id="job-v:1", generation=1, kind="crash", category="exited_abnormally",
        severity="SEV2", action="restart", observed_at=now() - 1, rank=0, node_id="node-0",
    )  # fmt: skip
    await cluster.add_job(
        "job-v", ["node-0"] * 2, 2, last_failure=earlier, transition_kind="in_place"
    )
    await bus.publish_report(exited("job-v", 1, "node-0", None, signal=9, gen=2))
    await no_event(events, "failure.detected", within_s=1.0)

    def stepped(job: Job) -> bool:
        job.stepping = True
        return True

    # Had generation 2 stepped meanwhile (no fallback then), its next report is still heard.
    await state.update_job("job-v", stepped)
    await bus.publish_report(exited("job-v", 0, "node-0", None, signal=9, gen=2))
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["generation"], failure["rank"]) == (2, 0)


async def test_node_failing_repeatedly_is_quarantined_then_released(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    await cluster.add_node("node-0")
    for index in range(3):
        await cluster.add_job(f"job-q{index}", ["node-0"])
        await bus.publish_report(ecc_error("node-0", f"job-q{index}"))
    change = (await next_event(events, "node.state_changed")).data
    assert (change["node_id"], change["old"], change["new"]) == ("node-0", "READY", "QUARANTINED")
    node = await state.get_node("node-0")
    assert node is not None and node.state == NodeState.QUARANTINED
    assert node.quarantined_until is not None and node.quarantined_until > now()
    released = (await next_event(events, "node.state_changed", timeout_s=4.0)).data
    assert (released["old"], released["new"]) == ("QUARANTINED", "READY")


def step(job: str, rank: int, index: int, compute_s: float) -> StepCompleted:
    return StepCompleted(
        node_id=f"node-{rank // 2}", job_id=job, generation=1, rank=rank, step=index,
        loss=1.0, iteration_s=0.1, compute_s=compute_s,
    )  # fmt: skip


async def test_straggler_is_named_within_30_steps_and_job_keeps_running(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    for node in ("node-0", "node-1"):
        await cluster.add_node(node)
    await cluster.add_job("job-s", ["node-0", "node-0", "node-1", "node-1"])
    noise = random.Random(7)
    for index in range(1, 41):
        for rank in range(4):
            base = 0.04 * (2.0 if rank == 2 else 1.0)
            await bus.publish_report(step("job-s", rank, index, base * noise.uniform(0.7, 1.6)))
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["kind"], failure["rank"], failure["action"]) == ("straggler", 2, "report")
    assert failure["evidence"]["step"] <= 30
    job = await state.get_job("job-s")
    assert job is not None and job.state.value == "RUNNING"


async def test_noisy_healthy_ranks_are_not_stragglers(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    await cluster.add_node("node-0")
    await cluster.add_job("job-n", ["node-0", "node-0", "node-1", "node-1"])
    noise = random.Random(11)
    for index in range(1, 201):
        for rank in range(4):
            spike = 3.0 if noise.random() < 0.05 else 1.0  # the other core's bursts
            await bus.publish_report(
                step("job-n", rank, index, 0.04 * spike * noise.uniform(0.7, 1.4))
            )
    await no_event(events, "failure.detected", within_s=1.0)


async def test_a_new_fault_after_a_recovery_that_trained_on_is_not_escalated(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    # Generation 2 recovered and did 15 steps: its recovery worked.
    failure = await reset_after_a_reattempt(cluster, bus, events, "job-p", steps_since=15)
    assert (failure["severity"], failure["action"]) == ("SEV3", "reattempt")
    assert "escalated_from" not in failure["evidence"]
