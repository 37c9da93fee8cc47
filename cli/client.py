"""HTTP client of the Unicron REST API, used by every client command of the CLI.

Failures become two exceptions the commands map to exit codes: :class:`ApiUnreachable` (no
answer at all) and :class:`ApiError` (the server answered with an error and says why).
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx
from unicron.shared.contracts.calibration import CalibrationRecord
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import Job, JobState, JobSummary, NodeRecord

DEFAULT_API_URL = "http://127.0.0.1:8080"
# A followed event stream carries a ping every 15 s; four missed pings mean the server is gone.
STREAM_READ_TIMEOUT_S = 60.0
UPLOAD_TIMEOUT_S = 300.0  # a package may be 100 MiB
# ``GET /v1/jobs`` answers a page at a time; the next page's cursor is in this header.
NEXT_CURSOR_HEADER = "X-Next-Cursor"
PAGE_LIMIT = 500  # the most jobs the API puts in one page


class ApiUnreachable(Exception):
    """No HTTP answer: the server is down, the address is wrong, or the connection broke."""


class ApiError(Exception):
    """The server answered with an error status; ``message`` is its explanation."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message


@dataclass(frozen=True)
class SseMessage:
    id: str | None
    event: str | None
    data: str


def error_message(response: httpx.Response) -> str:
    """The server's explanation: ``message`` or ``detail`` of a JSON error, else the text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(body, dict):
        if isinstance(body.get("message"), str):
            return str(body["message"])
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail
        if isinstance(detail, list):
            return "; ".join(
                f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail
            )
    return str(body)


def parse_sse(lines: Iterable[str]) -> Iterator[SseMessage]:
    """Server-sent events from their text lines; comments (keep-alive pings) are skipped."""
    event_id: str | None = None
    event: str | None = None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield SseMessage(event_id, event, "\n".join(data))
            event, data = None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            event_id = value
        elif field == "event":
            event = value
        elif field == "data":
            data.append(value)


class ApiClient:
    def __init__(
        self, base_url: str = DEFAULT_API_URL, timeout_s: float = 10.0, token: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # On the client itself, so every request sends it, including streams and callers
        # that use ``http`` directly.
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers)

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.http.close()

    def _unreachable(self, exc: httpx.TransportError) -> ApiUnreachable:
        return ApiUnreachable(f"cannot reach the Unicron API at {self.base_url}: {exc}")

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
        if response.is_error:
            raise ApiError(response.status_code, error_message(response))
        return response

    def submit(self, spec: dict[str, Any], idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Submit a job spec; returns the job and whether it was an idempotent replay."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        response = self._request("POST", "/v1/jobs", json=spec, headers=headers)
        replayed = response.headers.get("Idempotent-Replayed") == "true"
        return Job.model_validate(response.json()), replayed

    def upload_package(self, data: bytes) -> str:
        """Upload a tar.gz package; returns the ``pkg://<sha256>`` a job names it by."""
        sha256 = hashlib.sha256(data).hexdigest()
        response = self._request(
            "POST",
            "/v1/packages",
            params={"sha256": sha256},
            content=data,
            headers={"Content-Type": "application/gzip"},
            timeout=UPLOAD_TIMEOUT_S,
        )
        return str(response.json()["working_dir"])

    def job_pages(
        self, states: Sequence[JobState] = (), page_limit: int = PAGE_LIMIT
    ) -> Iterator[list[JobSummary]]:
        """The caller's jobs (oldest first, only ``states`` if given), page by page, following
        the API's cursor until the last page."""
        params: dict[str, Any] = {"limit": page_limit, "state": [s.value for s in states]}
        while True:
            response = self._request("GET", "/v1/jobs", params=params)
            yield [JobSummary.model_validate(j) for j in response.json()]
            cursor = response.headers.get(NEXT_CURSOR_HEADER)
            if cursor is None:
                return
            params["cursor"] = cursor

    def jobs(self, states: Sequence[JobState] = (), limit: int | None = None) -> list[JobSummary]:
        """Every job the caller may see (oldest first), or only the first ``limit``."""
        found: list[JobSummary] = []
        page_limit = PAGE_LIMIT if limit is None else min(max(limit, 1), PAGE_LIMIT)
        for page in self.job_pages(states, page_limit):
            found += page
            if limit is not None and len(found) >= limit:
                return found[:limit]
        return found

    def job(self, job_id: str) -> Job:
        return Job.model_validate(self._request("GET", f"/v1/jobs/{job_id}").json())

    def cancel(self, job_id: str) -> Job:
        return Job.model_validate(self._request("POST", f"/v1/jobs/{job_id}/cancel").json())

    def inject_fault(self, job_id: str, fault: dict[str, Any]) -> dict[str, Any]:
        """Send a FaultSpec; returns where it went: ``{fault_id, node_id, generation, …}``."""
        response = self._request("POST", f"/v1/jobs/{job_id}/faults", json=fault)
        accepted: dict[str, Any] = response.json()
        return accepted

    def calibration(self) -> CalibrationRecord:
        return CalibrationRecord.model_validate(self._request("GET", "/v1/calibration").json())

    def nodes(self) -> list[NodeRecord]:
        return [NodeRecord.model_validate(n) for n in self._request("GET", "/v1/nodes").json()]

    def events(
        self, since: int | None = None, follow: bool = False
    ) -> Generator[tuple[int, CloudEvent], None, None]:
        """(stream sequence, event) from ``since`` on; without ``follow``, only those stored now."""
        params: dict[str, Any] = {"follow": str(follow).lower()}
        if since is not None:
            params["since"] = since
        timeout = httpx.Timeout(10.0, read=STREAM_READ_TIMEOUT_S)
        try:
            with self.http.stream("GET", "/v1/events", params=params, timeout=timeout) as response:
                if response.is_error:
                    response.read()
                    raise ApiError(response.status_code, error_message(response))
                for message in parse_sse(response.iter_lines()):
                    yield int(message.id or 0), CloudEvent.model_validate_json(message.data)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc
