"""Only the node's own SEV1 faults count toward its quarantine; drills and job faults never."""

from __future__ import annotations

import asyncio
from typing import Any

from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import NodeState
from unicron.shared.contracts.reports import AnyWorkerReport, WorkerExited
from unicron.shared.store.state import StateStore

from tests.detector.conftest import Cluster, next_event, no_event
from tests.detector.test_correlation import reset_by_peer
from tests.detector.test_escalation import ecc_error

FAULTS = 4  # more than quarantine_threshold (3)


async def fail_jobs_on(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], report: AnyWorkerReport
) -> tuple[list[dict[str, Any]], list[str]]:
    """``FAULTS`` jobs on node-0, each failing once with ``report``: their failure.detected,
    and the node state changes (as "OLD->NEW") seen by the time the last was detected."""
    failures: list[dict[str, Any]] = []
    changes: list[str] = []
    for index in range(FAULTS):
        job_id = f"{report.kind}-{index}"
        await cluster.add_job(job_id, ["node-0"])
        await bus.publish_report(report.model_copy(update={"job_id": job_id}))
    async with asyncio.timeout(10):
        while len(failures) < FAULTS:
            event = await events.get()
            if event.type == "failure.detected":
                failures.append(event.data)
            elif event.type == "node.state_changed":
                changes.append(f"{event.data['old']}->{event.data['new']}")
    return failures, changes


async def node_state(state: StateStore) -> NodeState:
    node = await state.get_node("node-0")
    assert node is not None
    return node.state


async def test_crashes_and_network_faults_do_not_quarantine(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    await cluster.add_node("node-0")
    crash = WorkerExited(node_id="node-0", job_id="x", generation=1, rank=0, pid=1000,
                         exit_code=None, signal=9)  # fmt: skip
    for report in (crash, reset_by_peer("x", 0, "node-0", gen=1)):
        failures, changes = await fail_jobs_on(cluster, bus, events, report)
        assert {f["severity"] for f in failures} <= {"SEV2", "SEV3"} and changes == []
    await no_event(events, "node.state_changed", within_s=0.5)
    assert await node_state(state) == NodeState.READY


async def test_drilled_hardware_faults_do_not_quarantine(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    await cluster.add_node("node-0")
    for index in range(FAULTS):  # as POST /v1/jobs/{id}/faults marks each job it drills
        await state.mark_drill(f"worker_exception-{index}", 1, f"cmd-{index}", ttl_s=60)
    failures, changes = await fail_jobs_on(cluster, bus, events, ecc_error("node-0", "x"))
    assert changes == []
    assert sorted((f["severity"], f["evidence"]["drill"]) for f in failures) == [
        ("SEV1", f"cmd-{index}") for index in range(FAULTS)
    ]
    await no_event(events, "node.state_changed", within_s=0.5)
    assert await node_state(state) == NodeState.READY


async def test_repeated_hardware_faults_quarantine(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    await cluster.add_node("node-0")
    failures, changes = await fail_jobs_on(cluster, bus, events, ecc_error("node-0", "x"))
    assert {(f["severity"], "drill" in f["evidence"]) for f in failures} == {("SEV1", False)}
    if not changes:  # the change may be published just after the last failure
        change = (await next_event(events, "node.state_changed")).data
        changes.append(f"{change['old']}->{change['new']}")
    assert changes[0] == "READY->QUARANTINED"
    # The cooldown (1 s in these tests) then ends it: quarantine works as before.
    released = (await next_event(events, "node.state_changed", timeout_s=4.0)).data
    assert (released["old"], released["new"]) == ("QUARANTINED", "READY")
