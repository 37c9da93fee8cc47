"""Stopping tasks ends in a bounded time, even when a cancel is lost on the way."""

from __future__ import annotations

import asyncio
import contextlib

from unicron.shared.tasks import cancel_and_wait


async def test_a_task_that_loses_one_cancel_is_still_stopped() -> None:
    # What asyncio.wait_for does on 3.11 when the awaited thing finishes as the cancel lands:
    # the cancel is gone and the loop goes round again. A single cancel() + gather waited
    # forever on such a task (a CI teardown hung 300 s on it).
    swallowed = 0

    async def loses_one() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1

    async def polite() -> None:
        await asyncio.sleep(10)

    tasks = [asyncio.create_task(loses_one()), asyncio.create_task(polite())]
    await asyncio.sleep(0)
    async with asyncio.timeout(2):
        await cancel_and_wait(tasks, what="test")
    assert swallowed == 1 and all(task.cancelled() for task in tasks)


async def test_a_task_that_ignores_every_cancel_is_left_behind_at_the_deadline() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:  # as redis-py's retry loop did with a cancel mid-command
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    async with asyncio.timeout(2):
        await cancel_and_wait([task], what="test", timeout_s=0.2)
    assert not task.done()
    release.set()
    await task


async def test_a_task_that_failed_before_the_stop_does_not_raise_from_it() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await cancel_and_wait([task], what="test")
    assert isinstance(task.exception(), RuntimeError)
