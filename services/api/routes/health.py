"""Liveness, readiness and Prometheus metrics, outside /v1 where probes expect them.

The probes are open. ``/metrics`` names every tenant's jobs and every node (the state gauges
the alerts name them by), so where the API has tokens it takes an admin token, which the
operator's Prometheus sends (deploy/observability/prometheus.yml): a scrape without one is
refused, so a Prometheus set up without it sees the API down rather than alerts gone quiet."""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter, Response, status
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from unicron.services.api.access import AdminPrincipal
from unicron.services.api.deps import BusDep, MetricsDep, StateDep
from unicron.services.api.errors import errors
from unicron.shared.logging import get_logger
from unicron.shared.store.summaries import job_summaries

router = APIRouter(tags=["health"])
log = get_logger(component="api.health")
# A probe must answer well inside the kubelet's default 1 s timeout even when Redis hangs.
PING_TIMEOUT_S = 0.5


class Readiness(BaseModel):
    """``/readyz``: ready when NATS and Redis both answer; ``failed`` names those that do not."""

    status: Literal["ready", "not ready"]
    failed: list[str]
    checks: dict[str, str]


async def _redis_ok(state: StateDep) -> bool:
    try:
        return await asyncio.wait_for(state.ping(), PING_TIMEOUT_S)
    except Exception:
        return False


@router.get("/livez")
async def livez() -> dict[str, str]:
    """The process serves requests; restarting it would not fix a missing NATS or Redis."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": Readiness, "description": "not ready"}})
async def readyz(response: Response, bus: BusDep, state: StateDep) -> Readiness:
    """200 when both NATS and Redis answer, else 503 naming the one that does not."""
    checks = {
        "nats": "ok" if bus.connected else "disconnected",
        "redis": "ok" if await _redis_ok(state) else "unreachable",
    }
    failed = sorted(name for name, result in checks.items() if result != "ok")
    if failed:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return Readiness(status="not ready", failed=failed, checks=checks)
    return Readiness(status="ready", failed=[], checks=checks)


# The text format Prometheus reads, and errors as JSON like every other route's.
METRICS_TEXT = {
    "description": "the Prometheus text exposition format",
    "content": {"text/plain": {"schema": {"type": "string"}}},
}


@router.get("/metrics", response_class=Response, responses={200: METRICS_TEXT, **errors(401, 403)})
async def metrics(
    state: StateDep, bus: BusDep, api_metrics: MetricsDep, _: AdminPrincipal
) -> Response:
    try:
        # Every summary in the job index (unfinished, and finished within the store's
        # retention): the index is by submission time, with no index by state or end time to
        # read only the recent ones; a summary is small whatever the job's size.
        jobs, nodes = await asyncio.wait_for(
            asyncio.gather(job_summaries(state), state.list_nodes()), PING_TIMEOUT_S * 4
        )
        api_metrics.set_jobs(jobs)
        api_metrics.set_nodes(nodes)
    except Exception as exc:  # request metrics stay useful while Redis is away
        log.warning("jobs and nodes gauges not refreshed", error=repr(exc))
    return Response(api_metrics.render(bus.metrics), media_type=CONTENT_TYPE_LATEST)
