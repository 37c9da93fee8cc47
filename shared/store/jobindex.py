"""The job index: jobs in submission order, for paging, and how long a finished job is kept.

The index is a sorted set scored by submission time, and a job is always indexed after every
job already there, so a client paging with a :class:`JobPosition` sees each job once, even
while jobs are added. A job that ended (SUCCEEDED, FAILED, CANCELLED) is kept for the store's
``job_retention_s`` after it ended: its key gets that expiry whenever it is written in a
terminal state, and the index forgets a job whose key is gone the next time a listing meets
it. Running and pending jobs never expire.
"""

from __future__ import annotations

from typing import NamedTuple

from unicron.shared.contracts.models import Job

JOB_RETENTION_S = 7 * 24 * 3600.0  # UNICRON_JOB_RETENTION_S
# Index scores are submission times (~1.8e9 s, where a double's step is ~2.4e-7 s); a job
# that would sort before the last one indexed goes 1 us after it instead.
INDEX_STEP = "0.000001"
APPEND_JOB_SCRIPT = """
local score = tonumber(ARGV[2])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
if last[2] ~= nil and tonumber(last[2]) >= score then score = tonumber(last[2]) + ARGV[3] end
redis.call('SET', KEYS[1], ARGV[1])
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


def finished_at(job: Job) -> float | None:
    """When a job that ended entered its final state; None while it is not finished."""
    if not job.state.terminal:
        return None
    ended = (entry.at for entry in reversed(job.history) if entry.state == job.state)
    return next(ended, job.submitted_at)
