"""Prometheus metrics of the API: requests and latency by route, jobs and nodes by state, and
each node's and recent job's state (services/api/state_metrics.py).

Each app owns its registry, so several apps in one process (the tests) never collide on
metric names. Requests are labelled by route template, never by raw path, which would give
one time series per job id. ``/metrics`` serves it with its bus's registry (the bus metrics
every service has, shared/metrics.py).
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from unicron.services.api.state_metrics import ENDED_JOBS_S, StateCollector
from unicron.shared.contracts.models import JobState, JobSummary, NodeRecord, NodeState
from unicron.shared.metrics import ServiceMetrics

UNMATCHED = "<unmatched>"


class ApiMetrics:
    def __init__(self, ended_jobs_s: float = ENDED_JOBS_S) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "unicron_api_requests",
            "HTTP requests served, by method, route template and status code",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "unicron_api_request_duration_seconds",
            "Time from request to the first byte of the response, by route template",
            ["method", "route"],
            registry=self.registry,
        )
        self.jobs = Gauge(
            "unicron_jobs", "Jobs by state, read from Redis when scraped", ["state"],
            registry=self.registry,
        )  # fmt: skip
        self.nodes = Gauge(
            "unicron_nodes", "Nodes by state, read from Redis when scraped", ["state"],
            registry=self.registry,
        )  # fmt: skip
        self.states = StateCollector(ended_jobs_s)
        self.registry.register(self.states)

    def set_nodes(self, nodes: Sequence[NodeRecord]) -> None:
        counts = Tally(node.state for node in nodes)
        for state in NodeState:
            self.nodes.labels(state.value).set(counts.get(state, 0))
        self.states.set_nodes(nodes)

    def set_jobs(self, jobs: Sequence[JobSummary]) -> None:
        counts = Tally(job.state for job in jobs)
        for state in JobState:
            self.jobs.labels(state.value).set(counts.get(state, 0))
        self.states.set_jobs(jobs)

    def render(self, bus: ServiceMetrics | None = None) -> bytes:
        """This app's metrics, then its bus's."""
        return generate_latest(self.registry) + (bus.render() if bus is not None else b"")


def route_template(scope: Scope) -> str:
    """The template of the route that handled the request; the router records it in the scope."""
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) else UNMATCHED


class MetricsMiddleware:
    """Pure ASGI middleware, so streaming responses (SSE) pass through unbuffered."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        started = time.perf_counter()
        status = 500  # what the client gets if the app raises before responding

        async def send_and_measure(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                route = route_template(scope)
                self.metrics.latency.labels(method, route).observe(time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, send_and_measure)
        finally:
            self.metrics.requests.labels(method, route_template(scope), str(status)).inc()
