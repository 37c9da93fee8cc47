"""Redis through Sentinel: a client that always talks to the current primary.

The client asks the Sentinels (``UNICRON_REDIS_SENTINELS``) for the primary each time it opens a
connection. When the primary dies or is demoted, the connection fails (a demoted primary's
``READONLY`` answer included) with ``ConnectionError``: the service's retry sees an outage
(shared/outage.py), and its next attempt connects to whichever server the Sentinels promoted.
No restart, and nothing for a service to do but what it does for any Redis outage.

The login is ``UNICRON_REDIS_URL``'s user, password and database, as without Sentinel; its host
and port are not used. Every write waits for the replica (shared/store/replicated.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from unicron.shared.addresses import SentinelTarget, ServerListError
from unicron.shared.store.records import answers
from unicron.shared.store.replicated import Confirmations, ReplicatedRedis

SENTINEL_TIMEOUT_S = 0.5  # a dead Sentinel must not hold up asking the next one
CONNECT_TIMEOUT_S = 2.0
COMMAND_TIMEOUT_S = 5.0  # a primary cut off (not dead) fails over instead of hanging a call


def login_of(url: str) -> dict[str, Any]:
    """The user, password and database in a ``redis://`` URL."""
    parts = urlsplit(url)
    if parts.scheme != "redis":
        raise ServerListError(
            f"UNICRON_REDIS_URL must be redis://USER:PASSWORD@HOST:PORT/DB with Sentinels "
            f"(got {parts.scheme}://)"
        )
    login: dict[str, Any] = {"db": int(parts.path.strip("/") or 0)}
    if parts.username:
        login["username"] = parts.username
    if parts.password:
        login["password"] = parts.password
    return login


def sentinel_client(url: str, target: SentinelTarget) -> aioredis.Redis:
    """A client of ``target``'s primary, logged in as ``url`` says; it connects lazily."""
    sentinel = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(target.sentinels),
        sentinel_kwargs={"socket_timeout": SENTINEL_TIMEOUT_S, "password": target.password},
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=COMMAND_TIMEOUT_S,
    )
    client: ReplicatedRedis = sentinel.master_for(
        target.master,
        redis_class=ReplicatedRedis,
        decode_responses=True,
        health_check_interval=10,
        # No retries inside redis-py: its retry loop turns a cancel that lands mid-command into
        # a retried connection error, so a cancelled task runs on (a planner tearing down its
        # term waited on one forever). The services' own retries (shared/outage.py) take over.
        retry=Retry(NoBackoff(), 0),
        **login_of(url),
    )
    client.confirmations = Confirmations(target.replicas, _moving(sentinel, target.master))
    return client


def _moving(sentinel: Sentinel, master: str) -> Callable[[Connection], Awaitable[bool]]:
    async def moving(conn: Connection) -> bool:
        """Whether any Sentinel is failing over ``conn``'s server, or names another primary
        (only the Sentinel leading a failover knows of it until it is over)."""
        wrote_to = (conn.host, conn.port)
        asked = [s.sentinel_master(master) for s in sentinel.sentinels]
        for state in await asyncio.gather(*asked, return_exceptions=True):
            if not isinstance(state, dict):
                continue  # that Sentinel is away: the others tell
            primary = (str(state.get("ip")), int(state.get("port") or 0))
            if primary != wrote_to or "failover_in_progress" in str(state.get("flags")):
                return True
        return False

    return moving


async def connect_sentinel(url: str, target: SentinelTarget, timeout_s: float) -> aioredis.Redis:
    """:func:`sentinel_client`, once the primary answers; a refused login raises at once."""
    client = sentinel_client(url, target)
    await answers(client, timeout_s)
    return client
