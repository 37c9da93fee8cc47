"""Prometheus metrics of one service process: its registry, what every service measures of the
bus, and the ``/metrics`` server Prometheus scrapes (the catalogue: docs/design.md, "Metrics").

A service's bus holds its :class:`ServiceMetrics` (``EventBus.metrics``), so every part of the
service that has the bus has the registry, and the connections a leased service opens for each
term share it. Each registry is a service's own: services run side by side in one test process
never collide on a name. A service's metric module (``services/<svc>/metrics.py``) registers
there once, through :meth:`ServiceMetrics.part`, and may watch the events the service publishes
(:meth:`ServiceMetrics.watch`): a metric about a published event moves where it is published,
whichever code path published it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from threading import Thread
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server
from unicron.shared.contracts.events import EventData, JobStateChanged
from unicron.shared.logging import get_logger

P = TypeVar("P")
Watcher = Callable[[EventData], None]
log = get_logger(component="metrics")


@dataclass
class ConsumerMetrics:
    """The bus metrics of one durable consumer (:class:`unicron.shared.bus.delivery.Delivery`)."""

    pending: Any  # the consumer's child of unicron_bus_consumer_pending_messages
    redeliveries: Any
    behind: int = 0  # stored messages the server had not delivered yet, at the last delivery

    def received(self, deliveries: int, behind: int | None, held: int) -> None:
        """A message came: its delivery count, how many stored messages the server has not
        delivered yet (None: unknown, a lane copy), and how many this consumer holds."""
        if deliveries > 1:
            self.redeliveries.inc()
        if behind is not None:
            self.behind = behind
        self.settled(held)

    def settled(self, held: int) -> None:
        """The lag: what the server still has for the consumer plus what it holds unhandled."""
        self.pending.set(self.behind + held)


class ServiceMetrics:
    """One service's registry, with the metrics every service has (see the module doc)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._pending = Gauge(
            "unicron_bus_consumer_pending_messages",
            "Messages of a durable consumer not handled yet: not delivered, or held unacked",
            ["consumer"], registry=self.registry,
        )  # fmt: skip
        self._redeliveries = Counter(
            "unicron_bus_redeliveries", "Messages delivered to a consumer more than once",
            ["consumer"], registry=self.registry,
        )  # fmt: skip
        self._dead_letters = Counter(
            "unicron_dead_letters", "Messages this service dead-lettered", ["service"],
            registry=self.registry,
        )  # fmt: skip
        self._state_changes = Counter(
            "unicron_job_state_changes", "Job state changes this service made, by the new state",
            ["state"], registry=self.registry,
        )  # fmt: skip
        self._parts: dict[Callable[[ServiceMetrics], Any], Any] = {}
        self._watchers: list[Watcher] = []

    def consumer(self, durable: str) -> ConsumerMetrics:
        return ConsumerMetrics(self._pending.labels(durable), self._redeliveries.labels(durable))

    def dead_lettered(self, source: str) -> None:
        """One dead letter made by the bus client ``source`` (``unicron/<service>[/...]``)."""
        parts = source.split("/")
        self._dead_letters.labels(parts[1] if len(parts) > 1 else source).inc()

    def published(self, data: EventData) -> None:
        """The service published ``data``: count a job's state change, tell the watchers."""
        if isinstance(data, JobStateChanged):
            self._state_changes.labels(data.new.value).inc()
        for watcher in self._watchers:
            try:
                watcher(data)
            except Exception:  # a metric never fails the publish it counts
                log.exception("metric not updated", event_type=data.TYPE)

    def watch(self, watcher: Watcher) -> None:
        self._watchers.append(watcher)

    def part(self, make: Callable[[ServiceMetrics], P]) -> P:
        """The service-specific metrics ``make`` registers, made once per registry (a second
        registration of a name would raise)."""
        if make not in self._parts:
            self._parts[make] = make(self)
        made: P = self._parts[make]
        return made

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class MetricsServer:
    """The ``/metrics`` HTTP server of a service (prometheus-client's, in a daemon thread)."""

    server: WSGIServer
    thread: Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_metrics(metrics: ServiceMetrics, host: str, port: int) -> MetricsServer | None:
    """Serve ``metrics`` on ``host:port``; None when ``port`` is 0 (off) or taken. A taken port
    is logged, not fatal: a service heals jobs whether or not it is scraped."""
    if port == 0:
        return None
    try:
        server, thread = start_http_server(port, host, metrics.registry)
    except OSError as exc:
        log.error("metrics not served: port unavailable", host=host, port=port, error=str(exc))
        return None
    log.info("metrics served", url=f"http://{host}:{port}/metrics")
    return MetricsServer(server, thread)
