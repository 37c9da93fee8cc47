"""``unicron.AsyncClient``: the Unicron REST API from asyncio code, on ``httpx.AsyncClient``.

This is the one implementation of every call: :class:`unicron.Client` runs these same
coroutines for synchronous code. Answers come back as the models of
``unicron.shared.contracts``, errors as :mod:`unicron.errors` exceptions. ``wait`` watches the
job's state changes on the event stream rather than polling, and reads the job itself on each
(re)connection, so a change made before the stream was open is not missed.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator, Iterable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from unicron.errors import WaitTimedOut, raise_for, unreachable
from unicron.event_stream import CONNECTED, EventQuery, event_stream
from unicron.shared.contracts.calibration import CalibrationRecord
from unicron.shared.contracts.events import CloudEvent, JobStateChanged
from unicron.shared.contracts.jobspec import PackageStored
from unicron.shared.contracts.messages import FaultAccepted, FaultSpec
from unicron.shared.contracts.models import Job, JobSpec, JobState, JobSummary, NodeRecord
from unicron.shared.contracts.plans import Plan

DEFAULT_API_URL = "http://127.0.0.1:8080"
NEXT_CURSOR_HEADER = "X-Next-Cursor"  # the next page of ``GET /v1/jobs``, absent on the last
PAGE_LIMIT = 500  # the most jobs the API puts in one page
UPLOAD_TIMEOUT_S = 300.0  # a package may be 100 MiB
LOGS_READ_TIMEOUT_S = 60.0  # without follow the API sends the whole text at once
RESUME_FOR_S = 30.0
# Inside the clients ``list`` is a method: their annotations name lists by these.
JobSummaries = list[JobSummary]
NodeRecords = list[NodeRecord]


@dataclass(frozen=True)
class Submission:
    """A submitted job, and whether the API returned an earlier job for the same
    Idempotency-Key instead of creating one."""

    job: Job
    replayed: bool


def _json(value: BaseModel | Mapping[str, Any]) -> Any:
    # Only what was set: the API fills in its own defaults, as for a spec written by hand.
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    return dict(value)


def _job_path(job_id: str, rest: str = "") -> str:
    return f"/v1/jobs/{quote(job_id, safe='')}{rest}"


def _reached(state: JobState, wanted: frozenset[JobState]) -> bool:
    return state in wanted or state.terminal


class AsyncClient:
    """``AsyncClient(url, token)``; use it as ``async with`` or call :meth:`aclose`.

    ``resume_for_s`` is how long a broken event stream is retried before ``events`` and
    ``wait`` give up with :class:`unicron.ApiUnreachable`."""

    def __init__(
        self,
        url: str = DEFAULT_API_URL,
        token: str | None = None,
        *,
        timeout_s: float = 10.0,
        resume_for_s: float = RESUME_FOR_S,
    ) -> None:
        self.base_url = url.rstrip("/")
        self.resume_for_s = resume_for_s
        # On the client itself, so every request sends it, streams included.
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s, headers=headers)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from exc
        raise_for(response)
        return response

    async def submission(
        self, spec: JobSpec | Mapping[str, Any], idempotency_key: str | None = None
    ) -> Submission:
        """:meth:`submit`, telling also whether the key's earlier job came back."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        response = await self._send("POST", "/v1/jobs", json=_json(spec), headers=headers)
        replayed = response.headers.get("Idempotent-Replayed") == "true"
        return Submission(Job.model_validate(response.json()), replayed)

    async def submit(
        self, spec: JobSpec | Mapping[str, Any], idempotency_key: str | None = None
    ) -> Job:
        """Submit a job (a :class:`JobSpec` or its fields); the same ``idempotency_key`` again
        returns the same job."""
        return (await self.submission(spec, idempotency_key)).job

    async def get(self, job_id: str) -> Job:
        """The job with its workers and history."""
        return Job.model_validate((await self._send("GET", _job_path(job_id))).json())

    async def pages(
        self, states: Iterable[JobState] = (), page_limit: int = PAGE_LIMIT
    ) -> AsyncGenerator[JobSummaries, None]:
        """The caller's jobs (oldest first, only ``states`` if given) a page at a time."""
        params: dict[str, Any] = {"limit": page_limit, "state": [s.value for s in states]}
        while True:
            response = await self._send("GET", "/v1/jobs", params=params)
            yield [JobSummary.model_validate(j) for j in response.json()]
            cursor = response.headers.get(NEXT_CURSOR_HEADER)
            if cursor is None:
                return
            params["cursor"] = cursor

    async def list(self, states: Iterable[JobState] = (), limit: int | None = None) -> JobSummaries:
        """Every job the caller may see (oldest first), or only the first ``limit``."""
        found: JobSummaries = []
        page_limit = PAGE_LIMIT if limit is None else min(max(limit, 1), PAGE_LIMIT)
        async with aclosing(self.pages(states, page_limit)) as pages:
            async for page in pages:
                found += page
                if limit is not None and len(found) >= limit:
                    return found[:limit]
        return found

    async def cancel(self, job_id: str) -> Job:
        """Cancel the job (its workers are stopped); :class:`unicron.Conflict` once it ended."""
        return Job.model_validate((await self._send("POST", _job_path(job_id, "/cancel"))).json())

    async def wait(
        self, job_id: str, states: Iterable[JobState] = (), timeout_s: float | None = None
    ) -> Job:
        """The job once it is in one of ``states`` or has ended (no ``states``: once it has
        ended); :class:`unicron.WaitTimedOut` after ``timeout_s``."""
        wanted = frozenset(states)
        query = EventQuery(types=(JobStateChanged.TYPE,), job=job_id)
        try:
            async with asyncio.timeout(timeout_s):
                stream = event_stream(self.http, query, self.resume_for_s)
                async with aclosing(stream) as items:
                    async for item in items:
                        if item is not CONNECTED and not _announces(item[1], job_id, wanted):
                            continue
                        job = await self.get(job_id)  # the record is the truth, not the event
                        if _reached(job.state, wanted):
                            return job
        except TimeoutError:
            names = ", ".join(sorted(s.value for s in wanted)) or "an end"
            raise WaitTimedOut(
                f"job {job_id} did not reach {names} within {timeout_s:g} s"
            ) from None
        raise AssertionError("a followed event stream ends only by an exception")

    async def sequenced_events(
        self,
        types: Iterable[str] = (),
        job: str | None = None,
        since: int | None = None,
        follow: bool = True,
    ) -> AsyncGenerator[tuple[int, CloudEvent], None]:
        """:meth:`events` with each event's stream sequence (what ``since`` takes)."""
        query = EventQuery(tuple(types), job, since, follow)
        async with aclosing(event_stream(self.http, query, self.resume_for_s)) as items:
            async for item in items:
                if item is not CONNECTED:
                    yield item

    async def events(
        self,
        types: Iterable[str] = (),
        job: str | None = None,
        since: int | None = None,
        follow: bool = True,
    ) -> AsyncGenerator[CloudEvent, None]:
        """Events of ``types`` (all if none) about ``job`` (any if None), after sequence
        ``since`` (None: only new ones, or with ``follow=False`` all stored ones); with
        ``follow`` it goes on until closed, resuming a dropped connection where it broke."""
        async with aclosing(self.sequenced_events(types, job, since, follow)) as items:
            async for _, event in items:
                yield event

    async def logs(
        self,
        job_id: str,
        rank: int = 0,
        generation: int | None = None,
        tail: int = 100,
        follow: bool = False,
    ) -> AsyncGenerator[str, None]:
        """A rank's output (stdout and stderr) as it arrives; with ``follow`` until the
        worker has exited and everything is read."""
        params: dict[str, Any] = {"rank": rank, "tail": tail, "follow": str(follow).lower()}
        if generation is not None:
            params["generation"] = generation
        # a followed worker may print nothing for a long time: no read timeout then
        timeout = httpx.Timeout(10.0, read=None if follow else LOGS_READ_TIMEOUT_S)
        path = _job_path(job_id, "/logs")
        try:
            async with self.http.stream("GET", path, params=params, timeout=timeout) as response:
                if response.is_error:
                    await response.aread()
                    raise_for(response)
                async for text in response.aiter_text():
                    yield text
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, exc) from exc

    async def nodes(self) -> NodeRecords:
        response = await self._send("GET", "/v1/nodes")
        return [NodeRecord.model_validate(n) for n in response.json()]

    async def plan(self, plan_id: str | None = None) -> Plan:
        """The planner's plan ``plan_id``, or its latest."""
        path = f"/v1/plans/{quote(plan_id or 'latest', safe='')}"
        return Plan.model_validate((await self._send("GET", path)).json())

    async def calibration(self) -> CalibrationRecord:
        response = await self._send("GET", "/v1/calibration")
        return CalibrationRecord.model_validate(response.json())

    async def inject_fault(
        self, job_id: str, fault: FaultSpec | Mapping[str, Any]
    ) -> FaultAccepted:
        """Inject a fault into one rank of a running job (an admin's token when tokens are on)."""
        response = await self._send("POST", _job_path(job_id, "/faults"), json=_json(fault))
        return FaultAccepted.model_validate(response.json())

    async def upload_package(self, data: bytes) -> PackageStored:
        """Store a tar.gz for a job's ``working_dir`` (``PackageStored.working_dir`` names it)."""
        response = await self._send(
            "POST",
            "/v1/packages",
            params={"sha256": hashlib.sha256(data).hexdigest()},
            content=data,
            headers={"Content-Type": "application/gzip"},
            timeout=UPLOAD_TIMEOUT_S,
        )
        return PackageStored.model_validate(response.json())


def _announces(event: CloudEvent, job_id: str, wanted: frozenset[JobState]) -> bool:
    """Whether ``event`` says ``job_id`` moved into a state ``wait`` is waiting for; the API
    filters by job, but a server without the filter sends every event."""
    data = event.data
    if event.type != JobStateChanged.TYPE or data.get("job_id") != job_id:
        return False
    try:
        return _reached(JobState(data.get("new")), wanted)
    except ValueError:
        return False
