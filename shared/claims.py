"""Claim checks: a report is believed only when the job record agrees with what it says.

NATS permissions already stop an agent from publishing under another node's subject
(docs/design.md §6). The consumers then check what the report claims against the state: the
subject's node is the report's node, the job exists, and in the job's current generation the
rank runs on that node. A report about the node itself (``GpuHealthReport``) names no job: only
its node is checked; a node's batch of steps (``StepsCompleted``) is checked rank by rank. A
report of an older generation is history (a replaced worker on its way out) and passes: the
handlers themselves ignore what is stale. A refused report is dead-lettered and counted by the
bus (``ClaimRefusedError``).

Seats never move within a generation, so the seats of a (job, generation) are cached: the
per-step telemetry does not read the job record once per step.
"""

from __future__ import annotations

from collections import OrderedDict

from unicron.shared.bus.delivery import ClaimRefusedError
from unicron.shared.contracts.models import Job
from unicron.shared.contracts.reports import (
    REPORT_SUBJECT_PREFIX,
    AnyReport,
    AnyWorkerReport,
    GpuHealthReport,
    StepsCompleted,
)
from unicron.shared.logging import get_logger
from unicron.shared.store.api import JobStore

log = get_logger(component="claims")
CACHED_GENERATIONS = 256
Seats = dict[int, str]  # rank → node of one generation


def subject_node(subject: str) -> str | None:
    """The node a report subject names (``unicron.reports.<node>.<kind>``)."""
    if not subject.startswith(REPORT_SUBJECT_PREFIX):
        return None
    node, _, _kind = subject[len(REPORT_SUBJECT_PREFIX) :].rpartition(".")
    return node or None


def refusal(job: Job | None, report: AnyWorkerReport, subject_node_id: str | None) -> str | None:
    """Why ``report`` cannot be true given ``job`` (its record), or None when it can."""
    worker = f"rank {report.rank} of {report.job_id} generation {report.generation}"
    if subject_node_id != report.node_id:
        return f"a report about node {report.node_id!r} sent as node {subject_node_id!r}"
    if job is None:
        return f"{worker}: the job has no record"
    if report.generation > job.generation:
        return f"{worker}: the job is at generation {job.generation}"
    if report.generation < job.generation:
        return None
    seat = job.workers[report.rank].node_id if report.rank < len(job.workers) else None
    if seat != report.node_id:
        return f"{worker} runs on {seat!r}, not on {report.node_id!r}"
    return None


class ReportClaims:
    """The consumer-side check of reports, for ``Bus.consume(claim=…)``."""

    def __init__(self, state: JobStore) -> None:
        self.state = state
        self._seats: OrderedDict[tuple[str, int], Seats] = OrderedDict()

    async def check(self, subject: str, report: AnyReport) -> None:
        node = subject_node(subject)
        if isinstance(report, GpuHealthReport):
            if node != report.node_id:
                forged = f"a report about node {report.node_id!r} sent as node {node!r}"
                log.warning("report refused", node_id=node, why=forged)
                raise ClaimRefusedError(forged)
            return
        # a node's batch of steps holds only its own job's generation (the model checks that)
        for each in report.steps if isinstance(report, StepsCompleted) else [report]:
            await self._check_worker(node, each)

    async def _check_worker(self, node: str | None, report: AnyWorkerReport) -> None:
        seats = self._seats.get((report.job_id, report.generation))
        if seats is not None and node == report.node_id and seats.get(report.rank) == node:
            return
        job = await self.state.get_job(report.job_id)
        why = refusal(job, report, node)
        if why is not None:
            log.warning("report refused", job_id=report.job_id, node_id=node, why=why)
            raise ClaimRefusedError(why)
        if job is not None and job.generation == report.generation:
            self._remember(job)

    def _remember(self, job: Job) -> None:
        self._seats[(job.id, job.generation)] = {w.rank: w.node_id for w in job.workers}
        if len(self._seats) > CACHED_GENERATIONS:
            self._seats.popitem(last=False)
