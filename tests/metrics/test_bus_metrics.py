"""What every service measures of the bus, on a real NATS: consumer lag, redeliveries and dead
letters; and the /metrics server each service starts from its settings."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs
from unicron.services.agent.settings import AgentSettings
from unicron.services.detector.settings import DetectorSettings
from unicron.services.executor.settings import ExecutorSettings
from unicron.services.planner.settings import PlannerSettings
from unicron.shared.bus.api import Outgoing
from unicron.shared.bus.bus import Bus
from unicron.shared.metrics import ServiceMetrics, serve_metrics
from unicron.shared.procs import free_port

from tests.metrics.scrape import parse, value

SUBJECT = "unicron.reports.n1.worker_exited"
PENDING = "unicron_bus_consumer_pending_messages"


async def test_a_redelivered_message_and_a_dead_letter_are_counted(bus: Bus) -> None:
    handled: asyncio.Queue[dict[str, int]] = asyncio.Queue()
    failed_once: set[int] = set()

    async def handler(item: dict[str, int]) -> None:
        if item["n"] not in failed_once:  # the first delivery fails: the server sends it again
            failed_once.add(item["n"])
            raise RuntimeError("not this time")
        await handled.put(item)

    await bus.consume("unicron.reports.*.worker_exited", "metrics-test", json.loads, handler)
    await bus.send(Outgoing(SUBJECT, b"this is not json"))
    await bus.send(Outgoing(SUBJECT, b'{"n": 1}'))
    async with asyncio.timeout(10):
        assert await handled.get() == {"n": 1}
    samples = parse(bus.metrics.render().decode())
    assert value(samples, "unicron_bus_redeliveries_total", consumer="metrics-test") == 1
    assert value(samples, "unicron_dead_letters_total", service="test") == 1
    # held while handled, then acked: the lag comes back to nothing
    lag = (PENDING, frozenset({("consumer", "metrics-test")}))
    async with asyncio.timeout(5):
        # set by the delivery task as it finishes; absent until then
        while parse(bus.metrics.render().decode()).get(lag) != 0:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


def test_each_service_serves_its_metrics_on_its_own_port_and_a_taken_port_is_not_fatal() -> None:
    metrics = ServiceMetrics()
    metrics.dead_lettered("unicron/agent/n1")
    port = free_port()
    server = serve_metrics(metrics, "127.0.0.1", port)
    assert server is not None
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert value(parse(text), "unicron_dead_letters_total", service="agent") == 1
        with capture_logs() as logs:
            assert serve_metrics(ServiceMetrics(), "127.0.0.1", port) is None
        assert [e["event"] for e in logs] == ["metrics not served: port unavailable"]
    finally:
        server.close()
    assert serve_metrics(metrics, "127.0.0.1", 0) is None  # 0: off


def test_the_default_ports_follow_the_readme_and_a_bad_port_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    defaults = [s().metrics_port for s in (DetectorSettings, PlannerSettings, ExecutorSettings)]
    assert defaults == [9101, 9102, 9103]
    assert AgentSettings(node_id="n1").metrics_port == 9104
    monkeypatch.setenv("UNICRON_METRICS_PORT", "0")
    assert DetectorSettings().metrics_port == 0
    monkeypatch.setenv("UNICRON_METRICS_PORT", "70000")
    with pytest.raises(ValidationError, match="metrics_port"):
        DetectorSettings()
