"""The job index: jobs in submission order, for paging, and how long a finished job is kept.

Each job is kept twice: its record (every worker, its history), and a summary of it
(:class:`JobSummary`) written in the same transaction, which is all a listing reads: a page
of jobs costs the same whatever their size. A record without a summary (written before
summaries existed) gets one the first time a listing meets it.

The index is a sorted set scored by submission time, and a job is always indexed after every
job already there, so a client paging with a :class:`JobPosition` sees each job once, even
while jobs are added. A job that ended (SUCCEEDED, FAILED, CANCELLED) is kept for the store's
``job_retention_s`` after it ended: its key gets that expiry whenever it is written in a
terminal state, and the index forgets a job whose key is gone the next time a listing meets
it. Running and pending jobs never expire.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from unicron.shared.contracts.models import Job, JobSummary
from unicron.shared.store.records import M, parse_each

JOB_RETENTION_S = 7 * 24 * 3600.0  # UNICRON_JOB_RETENTION_S
# Index scores are submission times (~1.8e9 s, where a double's step is ~2.4e-7 s); a job
# that would sort before the last one indexed goes 1 us after it instead.
INDEX_STEP = "0.000001"
APPEND_JOB_SCRIPT = """
local score = tonumber(ARGV[2])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if last[2] ~= nil and tonumber(last[2]) >= score then score = tonumber(last[2]) + ARGV[3] end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[3], ARGV[5])
redis.call('ZADD', KEYS[2], string.format('%.17g', score), ARGV[4])
return 1
"""
# Unindex only ids whose record is really gone: a writer may have re-created one meanwhile.
FORGET_GONE_SCRIPT = """
local n = 0
for i, job_id in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then n = n + redis.call('ZREM', KEYS[1], job_id) end
end
return n
"""


class JobPosition(NamedTuple):
    """A place in the job index (submission order): a page goes on after it."""

    score: float
    job_id: str


def finished_at(job: Job | JobSummary) -> float | None:
    """When a job that ended entered its final state; None while it is not finished."""
    if not job.state.terminal:
        return None
    if isinstance(job, JobSummary):
        return job.state_since
    entry = job.entered()
    return job.submitted_at if entry is None else entry.at


Raw = str | bytes | None


def split_indexed(
    positions: list[JobPosition],
    summaries: list[Raw],
    records: dict[str, Raw],
    retention_s: float,
) -> tuple[list[tuple[JobPosition, JobSummary]], list[str], list[JobSummary]]:
    """The summaries at ``positions`` that exist, parse and are within retention; the ids of
    the jobs that are gone (absent, or past retention); and the summaries made from
    ``records`` (a job's record by id, read where its summary was absent) to be stored."""
    kept, gone, made = [], [], []
    for at, raw in zip(positions, summaries, strict=True):
        summary = _parsed(JobSummary, at.job_id, raw)
        if raw is None and (record := records.get(at.job_id)) is not None:
            raw = record
            job = _parsed(Job, at.job_id, record)
            summary = None if job is None else job.summary()
            made += [] if summary is None else [summary]
        ended = None if summary is None else finished_at(summary)
        if raw is None or (ended is not None and ended + retention_s <= time.time()):
            gone.append(at.job_id)
        elif summary is not None:
            kept.append((at, summary))
    return kept, gone, made


def _parsed(model: type[M], job_id: str, raw: Raw) -> M | None:
    parsed = parse_each(model, "job", [job_id], [raw])
    return parsed[0] if parsed else None
