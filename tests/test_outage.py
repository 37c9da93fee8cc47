"""Waiting out an outage: a server away is retried with back-off, a bug is raised at once."""

from __future__ import annotations

import pytest
from unicron.shared.outage import Outage


async def test_an_attempt_is_retried_through_an_outage_and_its_result_returned() -> None:
    failures = [ConnectionError("refused"), TimeoutError()]

    async def attempt() -> str:
        if failures:
            raise failures.pop(0)
        return "bound"

    outage = Outage("test", base_s=0.001)
    assert await outage.through(attempt) == "bound"
    assert not failures and not outage.down


async def test_an_error_that_is_not_an_outage_is_raised_at_once() -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("a bad consumer config")

    with pytest.raises(ValueError, match="bad consumer config"):
        await Outage("test").through(attempt)
    assert calls == 1
