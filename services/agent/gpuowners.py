"""Whose GPU a health report is about: the step between the NVML watch
(:mod:`unicron.services.agent.gpuhealth`) and the outbox.

The watch sees every GPU NVML shows; the agent may use only some of them (its
``CUDA_VISIBLE_DEVICES``, e.g. one of two agents ``unicron up`` starts on one host). For each
report this finds the GPU among the agent's devices (:meth:`SlotPool.place`):

- not one of them: dropped, as another agent's (or nobody's) to report;
- one of them: sent with ``held_by``, the ranks whose workers hold it, so the detector fails
  those jobs and names those ranks, not every job on the node; a SEV1 fault also retires the
  GPU from the slots, so no replacement is started on it, and its later faults are not sent:
  one faulty GPU, out of service, must not count again and again toward the quarantine of a
  node whose other GPUs are healthy;
- not to be told (no CUDA devices found, a MIG instance, another CUDA device order): sent as
  it is, and the detector takes it as the whole node's.
"""

from __future__ import annotations

from collections.abc import Callable

from unicron.services.agent.gpuhealth import ReportSink
from unicron.services.agent.gpus import SlotPool
from unicron.services.agent.workers import Worker
from unicron.shared.contracts.identity import JobRank
from unicron.shared.contracts.reports import GpuHealthReport
from unicron.shared.contracts.taxonomy import Severity
from unicron.shared.logging import get_logger


class GpuOwners:
    """A :class:`ReportSink` that places each report on the agent's devices and passes it on to
    ``sink``; ``live`` gives the node's live workers."""

    def __init__(
        self, node_id: str, slots: SlotPool, live: Callable[[], list[Worker]], sink: ReportSink
    ) -> None:
        self.slots = slots
        self.live = live
        self.sink = sink
        self.log = get_logger(component="gpu-health", node_id=node_id)

    def report(self, report: GpuHealthReport) -> None:
        place = self.slots.place(report.gpu, report.uuid)
        if not place.known:
            self.sink.report(report)
            return
        if not place.ours:
            self.log.info("GPU fault on a GPU this agent does not use", gpu=report.gpu,
                          uuid=report.uuid, message=report.message)  # fmt: skip
            return
        if place.slot in self.slots.retired:  # out of service: its faults count no more
            self.log.info("GPU fault on a GPU already retired", gpu=report.gpu,
                          message=report.message)  # fmt: skip
            return
        held = [] if place.slot is None else self._holders(place.slot)
        if place.slot is not None and report.severity == Severity.SEV1:
            self.slots.retire(place.slot, report.message)
            self.log.warning(
                "faulty GPU retired from the node's slots until the agent restarts",
                gpu=report.gpu, device=self.slots.devices[place.slot], slots=self.slots.count,
                why=report.message,
            )  # fmt: skip
        self.sink.report(report.model_copy(update={"held_by": held}))

    def _holders(self, slot: int) -> list[JobRank]:
        return [
            JobRank(job_id=k.job_id, generation=k.generation, rank=k.rank)
            for k in (w.current for w in self.live() if w.slot == slot)
        ]
