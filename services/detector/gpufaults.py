"""GPU faults an agent saw on its own node through NVML (``GpuHealthReport``): failures of the
jobs there.

Where the agent could tell which ranks hold the faulty GPU (``held_by``), the jobs of those ranks
get a candidate naming the rank on that GPU, and the node's other jobs keep running: their GPUs
are not the faulty one. Where it could not, the report is the node's and is turned into failures
as a lost node is (:mod:`unicron.services.detector.nodes`): every unfinished job with a live
worker on the node gets a candidate that names its lowest rank there. Either way all the job's
ranks on the node are in the evidence.
A SEV1 fault (an Xid of the taxonomy's classes, a double-bit ECC error, pages or rows waiting
for a reset, a lost GPU) is correlated like any other root cause, and once recorded counts
against the node (:mod:`unicron.services.detector.quarantine`). A slowdown is advisory, a
straggler hint: it is published at once, bypassing correlation as stragglers do, and the job
keeps running. A SEV1 fault on a node that runs no job counts toward the node's quarantine by
itself. A report from an earlier boot of the node's agent is stale: the new boot reads again
whatever still holds (pending rows, a lost GPU).
"""

from __future__ import annotations

from typing import Any

from unicron.services.detector.correlate import Correlator, Emit
from unicron.services.detector.nodes import seats_on
from unicron.services.detector.quarantine import NodeHealth
from unicron.services.detector.signals import Candidate
from unicron.shared.contracts.identity import JobRank, WorkerKey
from unicron.shared.contracts.reports import GpuHealthReport, report_id
from unicron.shared.contracts.taxonomy import FailureKind, RecoveryAction, Severity, severity_of
from unicron.shared.logging import get_logger
from unicron.shared.store.api import JobStore


def _evidence(report: GpuHealthReport, ranks: list[int]) -> dict[str, Any]:
    return {
        **report.evidence,
        "signal": report.signal.value,
        "gpu": report.gpu,
        "uuid": report.uuid,
        "ranks": ranks,
        "boot_id": report.boot_id,
        "message": report.message,  # the failure's message: what a user reads
    }


def holding(
    seats: list[tuple[WorkerKey, list[int]]], held_by: list[JobRank]
) -> list[tuple[WorkerKey, list[int]]]:
    """The seats of the jobs whose ranks hold the GPU, each naming its rank on the GPU; a job
    whose record no longer has that rank live on the node is left out (it moved on)."""
    held = {(h.job_id, h.rank) for h in held_by}
    chosen = []
    for seat, ranks in seats:
        on_gpu = [r for r in ranks if (seat.job_id, r) in held]
        if on_gpu:
            chosen.append((seat._replace(rank=on_gpu[0]), ranks))
    return chosen


class GpuFaults:
    def __init__(
        self, state: JobStore, correlator: Correlator, emit: Emit, health: NodeHealth
    ) -> None:
        self.state = state
        self.correlator = correlator
        self._emit = emit
        self.health = health

    async def on_report(self, report: GpuHealthReport) -> None:
        log = get_logger(node_id=report.node_id)
        node = await self.state.get_node(report.node_id)
        if node is not None and node.boot_id and node.boot_id != report.boot_id:
            log.info("stale GPU report ignored", boot_id=report.boot_id, now=node.boot_id)
            return
        severity, action = severity_of(report.category)
        seats = seats_on(await self.state.list_jobs(), report.node_id)
        if report.held_by is not None:
            seats = holding(seats, report.held_by)
        log.warning(
            "GPU fault reported", gpu=report.gpu, signal=report.signal.value,
            category=report.category.value, severity=severity.value, jobs=len(seats),
            message=report.message,
        )  # fmt: skip
        for seat, ranks in seats:
            candidate = Candidate.of(
                report.node_id, seat, FailureKind.HARDWARE, report.category, report.at,
                _evidence(report, ranks),
            )  # fmt: skip
            if action == RecoveryAction.REPORT:
                await self._emit(candidate)  # a hint: never held back, never holds others
            else:
                await self.correlator.add(candidate)
        if not seats and severity == Severity.SEV1:
            await self.health.count(report.node_id, report_id(report), report.at)
