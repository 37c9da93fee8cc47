"""A planner ending its term does not wait forever on a task that swallowed its cancel."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from unicron.services.planner import service


async def test_a_task_that_swallows_its_cancel_is_left_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(service, "CANCEL_WAIT_S", 0.2)
    release = asyncio.Event()

    async def stubborn() -> None:  # as redis-py's retry loop did with a cancel mid-command
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)

    async def polite() -> None:
        await asyncio.sleep(10)

    tasks = [asyncio.create_task(stubborn()), asyncio.create_task(polite())]
    await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    async with asyncio.timeout(2):
        await service._settle(tasks)
    assert tasks[1].cancelled() and not tasks[0].done()
    release.set()
    await tasks[0]
