"""Stopping background tasks in a bounded time, whatever they were doing.

On Python 3.11 a cancel can be lost: ``asyncio.wait_for`` swallows it when the awaited thing
finishes in the same loop iteration (CPython gh-86296), and client libraries that retry can
do the same. A task that loses its cancel and loops on never ends, and whoever waits on it —
a service shutting down, a planner standing by, a test's teardown — waits forever. So every
place that stops tasks goes through :func:`cancel_and_wait`: it cancels again until the task
is gone, and gives up, loudly, after a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from unicron.shared.logging import get_logger

log = get_logger()

CANCEL_WAIT_S = 5.0
# Long enough for a task's own clean-up after its cancel (a finally that awaits) not to be cut
# short; a lost cancel costs a stop this much.
RECANCEL_EVERY_S = 0.5


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task[Any]],
    what: str,
    timeout_s: float = CANCEL_WAIT_S,
) -> None:
    """Cancel ``tasks`` and wait until each has ended, at most ``timeout_s``.

    A task that ends with an error other than its cancel is logged, not raised: the caller is
    stopping, and one task's failure must not keep the others running. A task still running at
    the deadline is logged and left behind."""
    stopping = list(tasks)
    pending = {t for t in stopping if not t.done()}
    done = {t for t in stopping if t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        finished, pending = await asyncio.wait(pending, timeout=min(RECANCEL_EVERY_S, left))
        done |= finished
    for task in pending:
        log.error("task ignored its cancel; left behind", what=what, task=task.get_name())
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.error("task failed", what=what, task=task.get_name(), error=repr(task.exception()))
