"""Every job's summary: what a reconcile reads to find the few jobs it must look at whole.

A reconcile that read every job record every two seconds read every worker of every job: at
1,024 nodes, a 4,096-rank record parsed three times over by three services, whether or not
anything was wrong with it (docs/scale.md). A summary (:class:`JobSummary`) says what a
reconcile looks for — the state, the transition under way, how many workers failed or have
not started — and costs the same for a job of any size; a reconcile then reads the record of
only the jobs whose summary says there is something to do.
"""

from __future__ import annotations

import sys

from unicron.shared.contracts.models import JobSummary
from unicron.shared.store.api import JobStore


async def job_summaries(store: JobStore) -> list[JobSummary]:
    """The summary of every job in the index (running, pending, and finished within
    retention), in submission order."""
    positions = await store.index_after(None, 0, sys.maxsize)
    return [summary for _, summary in await store.read_indexed(positions)]
