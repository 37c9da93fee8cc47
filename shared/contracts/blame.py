"""Which failures are the job's own, as its count toward ``max_restarts`` sees them.

The detector counts them as it records each failure, and the replay after a Redis loss
(:mod:`unicron.shared.store.replay`) counts the same events again: both count here, so the two
agree.
"""

from __future__ import annotations

from unicron.shared.contracts.events import FailureDetected
from unicron.shared.contracts.models import FailureRecord
from unicron.shared.contracts.taxonomy import users_code


def job_failures(failure: FailureDetected, previous: FailureRecord | None) -> int:
    """How many failures of the job's own ``failure`` tells of: one of its code's; for one that
    followed the job to another node, two the first time (the one it came back from, the job's
    ``previous`` last failure, was the job's too), then one; none for any other."""
    if failure.follows_job:
        return 1 if previous is not None and previous.follows_job else 2
    return int(users_code(failure.category))
