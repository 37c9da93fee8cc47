"""State that survives: the embedded Redis keeps its data over a kill -9, and loops that lose
Redis back off quietly and recover."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.models import Job, JobSpec
from unicron.shared.outage import Outage, is_outage
from unicron.shared.servers.embedded import start_nats, start_redis
from unicron.shared.store.state import StateStore

from tests.api.live import eventually


async def test_a_job_survives_a_kill_9_of_the_embedded_redis(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis")
    try:
        state = await StateStore.connect(server.url, connect_timeout_s=5)
        await state.create_job(Job(id="job-1", name="a", spec=JobSpec(name="a")))
        await state.close()
        server.process.kill()  # SIGKILL: no shutdown save, only what the AOF holds
        server.process.wait()
        server.restart()
        state = await StateStore.connect(server.url, connect_timeout_s=5)
        job = await state.get_job("job-1")
        await state.close()
    finally:
        server.stop()
    assert job is not None and job.name == "a"
    assert any((tmp_path / "redis").rglob("*.aof")), "no append-only file in the data dir"


async def test_a_loop_logs_an_outage_once_and_recovers(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis")
    state = await StateStore.connect(server.url, connect_timeout_s=5)
    outage = Outage("test loop", base_s=0.01, cap_s=0.05)
    recovered, many_failed = asyncio.Event(), asyncio.Event()

    async def loop() -> None:  # a service's reconcile loop in miniature
        while True:
            try:
                await state.list_jobs()
                if outage.outages:
                    recovered.set()
                outage.ok()
            except Exception as exc:
                if outage.failed(exc) and outage.failures >= 20:
                    many_failed.set()
            await outage.pause()
            await asyncio.sleep(0.001)

    task = asyncio.create_task(loop())
    try:
        server.process.kill()
        server.process.wait()
        await asyncio.wait_for(many_failed.wait(), 10)  # many failed attempts …
        assert outage.outages == 1 and outage.errors_logged == 0  # … one warning, no traces
        server.restart()
        await asyncio.wait_for(recovered.wait(), 15)
        assert not outage.down
    finally:
        task.cancel()
        await state.close()
        server.stop()


def test_back_off_doubles_to_its_cap_and_only_connection_errors_are_outages() -> None:
    outage = Outage("x", base_s=0.1, cap_s=0.5)
    delays = [outage.failed(ConnectionRefusedError()) for _ in range(5)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    assert outage.outages == 1
    outage.ok()
    assert outage.delay() == 0.0
    assert is_outage(ConnectionResetError()) and not is_outage(ValueError("a bug"))
    outage.failed(ValueError("a bug"))
    assert outage.errors_logged == 1 and outage.outages == 1


async def test_a_lost_nats_is_one_warning_not_a_traceback_per_reconnect(tmp_path: Path) -> None:
    server = start_nats(tmp_path / "nats")
    bus = await Bus.connect(server.url, source="unicron/test")
    try:
        with capture_logs() as logs:
            server.process.kill()
            server.process.wait()

            async def failing() -> bool:  # reconnect attempts come every 0.5 s
                return bus.link_outage.failures >= 3

            async def back() -> bool:
                return not bus.link_outage.down

            await eventually(failing, timeout_s=10)
            server.restart()
            await eventually(back, timeout_s=15)
        events = [(e["log_level"], e["event"]) for e in logs]
        assert events == [
            ("warning", "nats connection: server unavailable; backing off"),
            ("info", "nats connection: recovered"),
        ], events
    finally:
        await bus.close()
        server.stop()
