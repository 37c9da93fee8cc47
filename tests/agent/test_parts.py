"""The small parts: settings, the entrypoint registry, the outbox and the rendezvous store."""

from __future__ import annotations

import asyncio
import socket
import sys

import pytest
from pydantic import ValidationError
from unicron.services.agent import registry
from unicron.services.agent.outbox import Outbox
from unicron.services.agent.settings import AgentSettings, default_node_id
from unicron.services.agent.store import RendezvousStore
from unicron.shared.bus.api import Outgoing
from unicron.shared.contracts.reports import StepCompleted, WorkerExited
from unicron.shared.procs import port_open

from tests.agent.conftest import until


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNICRON_NODE_ID", "gpu-7")
    monkeypatch.setenv("UNICRON_SLOTS", "8")
    monkeypatch.setenv("UNICRON_ENTRYPOINTS", '{"toy": "tests.agent.fake_worker"}')
    settings = AgentSettings()
    assert (settings.node_id, settings.slots, settings.store_port) == ("gpu-7", 8, 0)
    assert settings.entrypoints == {"toy": "tests.agent.fake_worker"}
    monkeypatch.setenv("UNICRON_NODE_ID", "a.b")  # a dot would split the NATS subject
    with pytest.raises(ValidationError):
        AgentSettings()
    assert "." not in default_node_id()


def test_registry_runs_only_registered_modules() -> None:
    reg = registry.build_registry({"toy": "tests.agent.fake_worker"})
    assert reg.argv("gpt") == [sys.executable, "-m", "unicron.trainer.worker"]
    assert reg.argv("toy")[-1] == "tests.agent.fake_worker"
    with pytest.raises(registry.UnknownTrainerError):
        reg.argv("evil")
    with pytest.raises(ValueError):
        reg.register("evil", "os; rm -rf /")
    registry.register("extra", "tests.agent.fake_worker")
    try:
        assert registry.build_registry({}).module("extra") == "tests.agent.fake_worker"
    finally:
        registry.REGISTRY._entries.pop("extra")


class FlakyBus:
    """Fails its first publishes, as JetStream does while it is away; ``stalled``: holds every
    store, as a stream electing a leader does."""

    def __init__(self, failures: int) -> None:
        self.connected = True
        self.failures = failures
        self.stalled = asyncio.Event()
        self.stalled.set()
        self.sent: asyncio.Queue[Outgoing] = asyncio.Queue()
        self.laned: asyncio.Queue[Outgoing] = asyncio.Queue()

    async def send(self, message: Outgoing) -> None:
        await self.stalled.wait()
        if self.failures:
            self.failures -= 1
            raise TimeoutError("no ack")
        self.sent.put_nowait(message)

    async def lane_ahead(self, messages: list[Outgoing]) -> None:
        for message in messages:
            self.laned.put_nowait(message)


def _step(step: int) -> StepCompleted:
    return StepCompleted(
        node_id="n", job_id="j", generation=1, rank=0, step=step, loss=1, iteration_s=1
    )


async def test_outbox_retries_in_order() -> None:
    bus = FlakyBus(failures=2)
    outbox = Outbox(bus, max_pending=2)  # type: ignore[arg-type]
    outbox.start()
    exit_report = WorkerExited(node_id="n", job_id="j", generation=1, rank=0, pid=1, exit_code=1)
    for report in (_step(1), _step(2), _step(3), exit_report):  # step 3 overflows: dropped
        outbox.report(report)
    got = [await asyncio.wait_for(bus.sent.get(), 5) for _ in range(3)]
    assert [m.what for m in got] == ["step_completed", "step_completed", "worker_exited"]
    assert outbox.dropped == 1
    await outbox.close()


async def test_outbox_holds_messages_while_disconnected() -> None:
    bus = FlakyBus(failures=0)
    bus.connected = False
    outbox = Outbox(bus)  # type: ignore[arg-type]
    outbox.start()
    outbox.report(_step(1))
    await asyncio.sleep(0.3)  # proving an absence takes some time
    assert bus.sent.empty()
    bus.connected = True
    sent = await asyncio.wait_for(bus.sent.get(), 5)
    assert StepCompleted.model_validate_json(sent.payload).step == 1
    assert bus.laned.empty()  # not on the lane while away: the store lanes it when it goes
    await outbox.close()


async def test_outbox_lanes_what_waits_behind_a_stalled_store() -> None:
    """A worker's exit queued behind step telemetry whose store is stalled goes out on the lane
    at once, after the telemetry and in order."""
    bus = FlakyBus(failures=0)
    bus.stalled.clear()
    outbox = Outbox(bus)  # type: ignore[arg-type]
    outbox.start()
    exit_report = WorkerExited(node_id="n", job_id="j", generation=1, rank=0, pid=1, exit_code=1)
    for report in (_step(1), _step(2), exit_report):
        outbox.report(report)
    laned = [await asyncio.wait_for(bus.laned.get(), 5) for _ in range(3)]
    assert [m.what for m in laned] == ["step_completed", "step_completed", "worker_exited"]
    assert bus.sent.empty()
    bus.stalled.set()
    stored = [await asyncio.wait_for(bus.sent.get(), 5) for _ in range(3)]
    assert [m.msg_id for m in stored] == [m.msg_id for m in laned]
    await outbox.close()


def _outbound_address() -> str | None:
    """This machine's non-loopback address, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = str(sock.getsockname()[0])
    return None if address.startswith("127.") else address


async def test_store_listens_on_its_host_only_and_serves() -> None:
    store = RendezvousStore("127.0.0.1")
    port = await store.start()
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    client = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
    client.set("job/g1/x", "1")
    assert client.get("job/g1/x") == b"1"
    other = _outbound_address()
    if other is not None:  # TCPStore by itself would listen on every interface
        assert not port_open(other, port)
    del client
    store.close()
    await until(lambda: not port_open("127.0.0.1", port))
