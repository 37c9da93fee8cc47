"""``unicron.Client``: the Unicron REST API from ordinary (synchronous) Python code.

    from unicron import Client, JobState

    with Client("http://127.0.0.1:8080", token) as client:
        job = client.submit({"name": "tiny", "steps": 100})
        done = client.wait(job.id, timeout_s=600)            # on the event stream, not polling
        for text in client.logs(job.id, rank=0):
            print(text, end="")

Every method runs the coroutine of the same name of :class:`unicron.AsyncClient` on an event
loop of the client's own, in a thread: one implementation of requests, errors, the event
stream's resume and ``wait`` for both, and the client works where a loop already runs (a
notebook). Streams (``events``, ``logs``) are generators; closing one, or breaking out of its
loop, closes the connection.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

from unicron.async_client import (
    DEFAULT_API_URL,
    PAGE_LIMIT,
    RESUME_FOR_S,
    AsyncClient,
    JobSummaries,
    NodeRecords,
    Submission,
)
from unicron.shared.contracts.calibration import CalibrationRecord
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.jobspec import PackageStored
from unicron.shared.contracts.messages import FaultAccepted, FaultSpec
from unicron.shared.contracts.models import Job, JobSpec, JobState
from unicron.shared.contracts.plans import Plan

T = TypeVar("T")
# How long a call interrupted by Ctrl-C may take to unwind before the caller moves on.
CANCEL_WAIT_S = 5.0


async def _step(stream: AsyncIterator[T]) -> list[T]:
    """The next item, or none at the end: StopAsyncIteration must not cross the thread as a
    future's exception."""
    try:
        return [await anext(stream)]
    except StopAsyncIteration:
        return []


class _Loop:
    """An event loop in a daemon thread that runs the client's coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="unicron-client", daemon=True
        )
        self.thread.start()

    def run(self, call: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(call, self.loop)
        try:
            return future.result()
        except BaseException:
            # Interrupted here (Ctrl-C): stop the call there too, and let it unwind.
            future.cancel()
            concurrent.futures.wait([future], timeout=CANCEL_WAIT_S)
            raise

    def iterate(self, stream: AsyncGenerator[T, None]) -> Iterator[T]:
        try:
            while True:
                step = self.run(_step(stream))
                if not step:
                    return
                yield step[0]
        finally:
            if self.loop.is_running():
                self.run(stream.aclose())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class Client:
    """``Client(url, token)``; use it as a context manager or call :meth:`close`. Methods,
    arguments and exceptions are :class:`unicron.AsyncClient`'s."""

    def __init__(
        self,
        url: str = DEFAULT_API_URL,
        token: str | None = None,
        *,
        timeout_s: float = 10.0,
        resume_for_s: float = RESUME_FOR_S,
    ) -> None:
        self.aio = AsyncClient(url, token, timeout_s=timeout_s, resume_for_s=resume_for_s)
        self.base_url = self.aio.base_url
        self._loop = _Loop()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.loop.is_closed():
            return
        try:
            self._loop.run(self.aio.aclose())
        finally:
            self._loop.stop()

    def submission(
        self, spec: JobSpec | Mapping[str, Any], idempotency_key: str | None = None
    ) -> Submission:
        return self._loop.run(self.aio.submission(spec, idempotency_key))

    def submit(self, spec: JobSpec | Mapping[str, Any], idempotency_key: str | None = None) -> Job:
        return self._loop.run(self.aio.submit(spec, idempotency_key))

    def get(self, job_id: str) -> Job:
        return self._loop.run(self.aio.get(job_id))

    def pages(
        self, states: Iterable[JobState] = (), page_limit: int = PAGE_LIMIT
    ) -> Iterator[JobSummaries]:
        return self._loop.iterate(self.aio.pages(states, page_limit))

    def list(self, states: Iterable[JobState] = (), limit: int | None = None) -> JobSummaries:
        return self._loop.run(self.aio.list(states, limit))

    def cancel(self, job_id: str) -> Job:
        return self._loop.run(self.aio.cancel(job_id))

    def wait(
        self, job_id: str, states: Iterable[JobState] = (), timeout_s: float | None = None
    ) -> Job:
        return self._loop.run(self.aio.wait(job_id, states, timeout_s))

    def sequenced_events(
        self,
        types: Iterable[str] = (),
        job: str | None = None,
        since: int | None = None,
        follow: bool = True,
    ) -> Iterator[tuple[int, CloudEvent]]:
        return self._loop.iterate(self.aio.sequenced_events(types, job, since, follow))

    def events(
        self,
        types: Iterable[str] = (),
        job: str | None = None,
        since: int | None = None,
        follow: bool = True,
    ) -> Iterator[CloudEvent]:
        return self._loop.iterate(self.aio.events(types, job, since, follow))

    def logs(
        self,
        job_id: str,
        rank: int = 0,
        generation: int | None = None,
        tail: int = 100,
        follow: bool = False,
    ) -> Iterator[str]:
        return self._loop.iterate(self.aio.logs(job_id, rank, generation, tail, follow))

    def nodes(self) -> NodeRecords:
        return self._loop.run(self.aio.nodes())

    def plan(self, plan_id: str | None = None) -> Plan:
        return self._loop.run(self.aio.plan(plan_id))

    def calibration(self) -> CalibrationRecord:
        return self._loop.run(self.aio.calibration())

    def inject_fault(self, job_id: str, fault: FaultSpec | Mapping[str, Any]) -> FaultAccepted:
        return self._loop.run(self.aio.inject_fault(job_id, fault))

    def upload_package(self, data: bytes) -> PackageStored:
        return self._loop.run(self.aio.upload_package(data))
