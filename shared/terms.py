"""One active instance of a role at a time: stand by, serve a term while its lease is held.

The planner and the executor each run as one active instance and any number of warm standbys
(``unicron up --ha``, two replicas on Kubernetes). An instance waits on the role's lease
(:mod:`unicron.shared.store.lease`), serves a term while it holds it — its subscriptions on a
connection of their own, so a standby takes no message away from the active instance's
durable consumers — and stands by again when the lease is lost. A term that fails (a server
away past its retries, a bug) hands the lease back and waits one TTL, so another instance can
take the role meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from unicron.shared.logging import get_logger
from unicron.shared.outage import describe, is_outage
from unicron.shared.store.lease import Lease
from unicron.shared.tasks import cancel_and_wait

log = get_logger(component="terms")


async def serve_terms(
    lease: Lease, term: Callable[[], Awaitable[None]], stop: asyncio.Event
) -> None:
    """Serve ``term`` each time ``lease`` is acquired, until ``stop``; release it on the way out.
    ``term`` returns when the lease is lost or ``stop`` is set."""
    try:
        while await lease.acquire(stop):
            try:
                await term()
            except Exception as exc:
                if is_outage(exc):
                    log.warning(
                        "term ended: server unavailable", role=lease.name, error=describe(exc)
                    )
                else:
                    log.exception("term failed; standing by", role=lease.name)
                await lease.release()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), lease.ttl_s)
    finally:
        await lease.release()


@contextlib.asynccontextmanager
async def renewing(lease: Lease, stop: asyncio.Event) -> AsyncIterator[asyncio.Task[None]]:
    """Renew ``lease`` from a term's first line; the task yielded ends when the lease is lost.
    A term's set-up (a connection, its durable consumers bound on a loaded NATS cluster) took
    longer than the 1.5-s TTL in ``bench/chaos.py --ha``, and a lease renewed only after it
    lapsed: the new planner lost its first term and its first plan."""
    keeper = asyncio.create_task(lease.keep(stop), name=f"{lease.name} lease")
    try:
        yield keeper
    finally:
        await cancel_and_wait([keeper], what=f"{lease.name} lease renewal")


class Connection(Protocol):
    async def close(self) -> None: ...


S = TypeVar("S", bound=Connection)


async def hold_term(
    lease: Lease,
    stop: asyncio.Event,
    loops: Sequence[Callable[[], Coroutine[Any, Any, None]]],
    connect: Callable[[], Awaitable[S]],
    subscribe: Callable[[S], Awaitable[None]],
    prepare: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """One term, until the lease is lost or ``stop`` is set: renew the lease from the first
    line, ``prepare``, start ``loops``, then ``connect`` (a connection of the term's own) and
    ``subscribe`` on it; at the end stop the loops and close the connection, which ends the
    subscriptions, so a standby takes nothing away from the active instance's consumers. The
    loops start before the subscriptions, so a new term acts (the planner's first plan)
    without waiting for its consumers to be bound."""
    async with renewing(lease, stop) as kept:
        if prepare is not None:
            await prepare()
        tasks = [asyncio.create_task(loop()) for loop in loops]
        connection: S | None = None
        try:
            connection = await connect()
            await subscribe(connection)
            await kept
        finally:
            await cancel_and_wait(tasks, what=f"{lease.name} loops")
            if connection is not None:
                with contextlib.suppress(Exception):
                    await connection.close()


class NotHolderError(ConnectionError):
    """The role's lease is no longer this instance's: the message is left unacked (as in an
    outage) and goes to the instance that holds the lease now."""


def check_holder(lease: Lease) -> None:
    if not lease.held():
        raise NotHolderError(f"the {lease.name} lease is not held by this instance")
