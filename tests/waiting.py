"""Waiting on a condition in a test: poll with a deadline, fail naming what never came."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    what: str,
    probe: Callable[[], Any],
    timeout_s: float = 90.0,
    interval_s: float = 0.1,
    tolerate: tuple[type[Exception], ...] = (),
) -> Any:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` on timeout. An
    exception in ``tolerate`` (a server still starting) counts as a miss, not a failure."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except tolerate as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")
