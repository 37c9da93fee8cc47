"""Pages of ``GET /v1/jobs``: the scan over the job index, and the cursor a client continues with.

The body of a page stays a bare JSON list of jobs, as before paging existed, each a summary
(no workers, no history: a page costs the same whatever the jobs' sizes); the next page's
cursor travels in the ``X-Next-Cursor`` header, absent on the last page. A cursor is the
index position (submission order) of the last job the page showed, so it stays valid while
jobs are added or expire, and pages never repeat or skip a job. It says nothing about tenants:
whoever presents it still sees only the jobs its token may see.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from fastapi.exceptions import RequestValidationError
from unicron.shared.contracts.models import JobSummary
from unicron.shared.store.jobindex import JobPosition
from unicron.shared.store.state import StateStore

NEXT_CURSOR_HEADER = "X-Next-Cursor"
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
MAX_CURSOR_CHARS = 512
# The index is read in batches, and at most SCAN_LIMIT entries per request: a user's page
# among many other tenants' jobs ends early, with a cursor to go on from, instead of reading
# the whole index in one request.
BATCH = 200
SCAN_LIMIT = 5000


@dataclass(frozen=True)
class JobPage:
    """Up to ``limit`` jobs in submission order; ``next_after`` is None only at the end."""

    jobs: list[JobSummary]
    next_after: JobPosition | None


def encode_cursor(position: JobPosition) -> str:
    raw = json.dumps([position.score, position.job_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _bad_cursor(why: str) -> RequestValidationError:
    # Shaped like pydantic's own errors, so the client shows it as any other invalid field.
    msg = f"not a cursor this API gave out ({why}); pass the X-Next-Cursor of the last page"
    return RequestValidationError([{"loc": ("query", "cursor"), "msg": msg, "type": "value_error"}])


def decode_cursor(cursor: str) -> JobPosition:
    """The position a cursor names, or the 422 saying why it names none (its length is
    bounded by the route: ``MAX_CURSOR_CHARS``)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        score, job_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        raise _bad_cursor("not base64url of a position") from None
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise _bad_cursor("its position is not a finite number")
    if not isinstance(job_id, str) or not job_id:
        raise _bad_cursor("it names no job")
    return JobPosition(float(score), job_id)


async def page_jobs(
    state: StateStore,
    after: JobPosition | None,
    limit: int,
    keep: Callable[[JobSummary], bool],
    scan_limit: int = SCAN_LIMIT,
) -> JobPage:
    """Up to ``limit`` jobs that ``keep`` accepts, in submission order after ``after``.

    A page holds fewer than ``limit`` but still a ``next_after`` when it read ``scan_limit``
    index entries first: only ``next_after is None`` means the end.
    """
    found: list[tuple[JobPosition, JobSummary]] = []
    position, scanned, ties = after, 0, 0
    while scanned < scan_limit:
        batch = await state.index_after(position, ties, min(BATCH, scan_limit - scanned))
        if not batch:
            return JobPage([job for _, job in found], None)
        fresh = [p for p in batch if position is None or p > position]
        # Only entries tied with ``position`` came back: step over them by offset. Those do
        # not count as scanned, so a page that ends early has always moved on.
        ties = 0 if fresh else ties + len(batch)
        scanned += len(fresh)
        for at, job in await state.read_indexed(fresh):
            if keep(job):
                found.append((at, job))
            if len(found) > limit:  # one more than asked: a next page exists
                return JobPage([job for _, job in found[:limit]], found[limit - 1][0])
        if fresh:
            position = fresh[-1]
    return JobPage([job for _, job in found], position)
