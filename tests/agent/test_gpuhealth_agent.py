"""GPU health in the agent on a node as it is: without NVML the agent runs and says why once;
on the real bus and Redis, with the detector's own code, a SEV1 Xid fails the job on the node
and quarantines the node (issue 21, item 4). NVML, where there is one, is the recorded H200
of ``tests/agent/fakenvml.py``."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from unicron.services.agent.agent import Agent
from unicron.services.agent.gpuhealth import GpuHealthWatch
from unicron.services.agent.outbox import Outbox
from unicron.services.agent.settings import AgentSettings
from unicron.services.detector.service import run as run_detector
from unicron.services.detector.settings import DetectorSettings
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import (
    Job,
    JobSpec,
    JobState,
    NodeRecord,
    NodeState,
    WorkerRecord,
    WorkerState,
)
from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.shared.store.state import StateStore

from tests.agent.conftest import until
from tests.agent.fakenvml import BOOT, FakeNvml, Reports, watching
from tests.agent.process import inbox

H200_UUID = "GPU-ffdc4ba6-2cf9-2de4-19e4-9f0341e99ef6"


async def watch_says(watch: GpuHealthWatch) -> list[str]:
    """Run a watch that has nothing to watch: it returns by itself; what it logged."""
    with capture_logs() as logs:
        await asyncio.wait_for(watch.run(), timeout=5)
    return [f"{e['event']}: {e.get('why')}" for e in logs]


async def test_without_nvidia_ml_py_the_watch_says_why_once_and_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now fails
    said = await watch_says(GpuHealthWatch("n1", BOOT, Reports(), 5.0))
    why = "nvidia-ml-py is not installed (pip install 'unicron[gpu]')"
    assert said == [f"GPU health watch not started: {why}"]


@pytest.mark.parametrize(
    ("fake", "why"),
    [(FakeNvml.h200(init_error="LibraryNotFound"),
      "NVML did not start: NVML Shared Library Not Found (no NVIDIA driver here?)"),
     (FakeNvml([]), "NVML sees no GPU on this node")],
    ids=["no-driver", "no-gpu"],
)  # fmt: skip
async def test_a_node_without_a_driver_or_a_gpu_says_why(fake: FakeNvml, why: str) -> None:
    said = await watch_says(GpuHealthWatch("n1", BOOT, Reports(), 5.0, load=lambda: fake))
    assert said == [f"GPU health watch not started: {why}"]
    assert fake.shutdowns == (0 if fake.init_error else 1)


async def test_the_agent_runs_without_nvml_and_says_so(
    bus: Bus, state: StateStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    agent = Agent(AgentSettings(node_id="n1", data_dir=tmp_path, spares=0), bus, state)
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(agent.run(stop))
        try:
            # generous: the agent imports torch for its store, slow on a loaded machine
            await until(lambda: agent.registration.registered or task.done(), within=60)
            assert not task.done()
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=30)
    said = [e for e in logs if e["event"] == "GPU health watch not started"]
    assert len(said) == 1 and "nvidia-ml-py is not installed" in said[0]["why"]


async def test_a_sev1_xid_fails_the_job_on_the_node_and_quarantines_the_node(
    bus: Bus, state: StateStore, nats_url: str, redis_url: str
) -> None:
    """The real path: watch → outbox → NATS → the detector → Redis and the events a user sees."""
    for node, boot in (("n1", BOOT), ("n2", "boot-n2")):
        await state.put_node(NodeRecord(id=node, slots=1, boot_id=boot))
    workers = [WorkerRecord(rank=r, node_id=n, pid=100 + r, state=WorkerState.RUNNING)
               for r, n in enumerate(["n2", "n1"])]  # fmt: skip
    await state.create_job(Job(id="job-x", name="x", spec=JobSpec(name="x"), generation=1,
                               state=JobState.RUNNING, world_size=2, workers=workers))  # fmt: skip
    events = await inbox(bus, "unicron.events.>", parse_event)
    settings = DetectorSettings(nats_url=nats_url, redis_url=redis_url, heartbeat_interval_s=30.0,
                                quarantine_threshold=1)  # fmt: skip
    detector_bus = await Bus.connect(nats_url, source="unicron/detector")
    detector_state = await StateStore.connect(redis_url)
    stop = asyncio.Event()
    detector = asyncio.create_task(run_detector(detector_bus, detector_state, stop, settings))
    outbox = Outbox(bus)
    outbox.start()
    fake = FakeNvml.h200()
    try:
        async with watching(fake, sink=outbox):
            fake.xid(0, 79)
            failure = await events.next(lambda e: _is(e, "failure.detected"), within=15)
            changed = await events.next(lambda e: _is(e, "node.state_changed"), within=15)
    finally:
        stop.set()
        await detector
        await outbox.close()
        await detector_bus.close()
        await detector_state.close()
    assert isinstance(failure, CloudEvent) and isinstance(changed, CloudEvent)
    data = failure.data
    assert (data["job_id"], data["node_id"], data["rank"]) == ("job-x", "n1", 1)
    assert (data["kind"], data["category"]) == ("hardware", "gpu_driver")
    assert (data["severity"], data["action"]) == ("SEV1", "reconfigure")
    assert data["evidence"]["xid"] == 79 and data["evidence"]["uuid"] == H200_UUID
    assert data["message"] == "Xid 79: the GPU has fallen off the bus"
    assert (changed.data["node_id"], changed.data["new"]) == ("n1", "QUARANTINED")
    job = await state.get_job("job-x")
    assert job is not None and job.state == JobState.RECOVERING
    assert job.last_failure is not None and job.last_failure.category == FailureCategory.GPU_DRIVER
    node = await state.get_node("n1")
    assert node is not None and node.state == NodeState.QUARANTINED


def _is(item: object, kind: str) -> bool:
    return isinstance(item, CloudEvent) and item.type == kind
