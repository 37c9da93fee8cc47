"""A Redis client whose writes count as done only once a replica has them too.

Redis replicates asynchronously: a primary that dies right after it answered a write takes that
write with it, and the replica the Sentinels promote never had it. So, when a replica is
configured (shared/store/sentinel.py), every command that may write is followed on the same
connection by ``WAIT <replicas> <timeout>``, and returns only after the replica acknowledged it.
That covers every writer in one place, whatever it calls: single commands, scripts, MULTI/EXEC
transactions (the records' WATCH updates), and the leases built on the same client.

A replica that does not confirm in time is either away or being promoted. Away (dead, cut
off), it does not fail the write, which the primary did apply: the write stands unconfirmed,
one warning says so, and until a write is confirmed again each ``WAIT`` is short, so a lost
replica slows writes by at most ``DEGRADED_WAIT_MS``. Promoted (the Sentinels are replacing the
primary, or just did: ``moving``), the write is on a primary about to be demoted, whose data the
new primary overwrites, so it raises ``ConnectionError``, and the caller's retry (an outage:
shared/outage.py) writes it again on the new primary. So does a write whose
primary dies before ``WAIT`` answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import Connection
from unicron.shared.logging import get_logger

log = get_logger(component="state")
WAIT_MS = 1000  # loopback or a LAN confirms in well under a millisecond; this is for a sick one
DEGRADED_WAIT_MS = 50
# Commands that never write; any other (SET, EVALSHA, EXEC, ...) waits for the replica. A read
# missing here only costs one round trip: WAIT returns at once when nothing is unconfirmed.
_READ_COMMANDS = """GET MGET EXISTS TTL PTTL TYPE STRLEN ZRANGE ZRANGEBYSCORE ZREVRANGE
ZREVRANGEBYSCORE ZSCORE ZMSCORE ZCARD ZCOUNT ZRANK SMEMBERS SISMEMBER SCARD HGET HGETALL HMGET
HKEYS HVALS HLEN HEXISTS LRANGE LLEN LINDEX SCAN SSCAN ZSCAN HSCAN PING ECHO INFO TIME DBSIZE
WATCH UNWATCH MULTI DISCARD WAIT ROLE"""
READS = frozenset(_READ_COMMANDS.split()) | {
    "SCRIPT LOAD",
    "SCRIPT EXISTS",
    "CLIENT SETNAME",
    "CLIENT ID",
}


def writes(command: Any) -> bool:
    name = command.decode() if isinstance(command, bytes) else str(command)
    return name.upper() not in READS


class Confirmations:
    """How many replicas must confirm a write, and whether they have lately; ``moving`` says
    whether the primary a connection wrote to is being replaced (shared/store/sentinel.py)."""

    def __init__(
        self, replicas: int = 1, moving: Callable[[Connection], Awaitable[bool]] | None = None
    ) -> None:
        self.replicas = replicas
        self.moving = moving
        self.unconfirmed = 0  # writes that stood without a confirmation, for tests and metrics
        self._degraded = False

    async def confirm(self, conn: Connection) -> None:
        """Wait on ``conn`` until the replicas have every write it made."""
        timeout_ms = DEGRADED_WAIT_MS if self._degraded else WAIT_MS
        await conn.send_command("WAIT", self.replicas, timeout_ms)
        acked = int(await conn.read_response())
        if acked >= self.replicas:
            if self._degraded:
                log.info("redis replica confirms writes again")
            self._degraded = False
            return
        if self.moving is not None and await self.moving(conn):
            raise redis.exceptions.ConnectionError(
                "the Redis primary is being replaced: a write it took unreplicated is written "
                "again on the new one"
            )
        self.unconfirmed += 1
        if not self._degraded:
            log.warning(
                "redis replica did not confirm a write: until it is back, a failover may lose "
                "the latest writes",
                replicas=self.replicas,
                acked=acked,
            )
        self._degraded = True


class ReplicatedPipeline(Pipeline):
    confirmations: Confirmations

    async def _send_command_parse_response(
        self, conn: Connection, command_name: Any, *args: Any, **options: Any
    ) -> Any:
        response = await super()._send_command_parse_response(  # type: ignore[no-untyped-call]
            conn, command_name, *args, **options
        )
        if writes(command_name):  # a write while WATCHing, outside the transaction
            await self.confirmations.confirm(conn)
        return response

    async def _execute_transaction(
        self, connection: Connection, commands: Any, raise_on_error: Any
    ) -> Any:
        response = await super()._execute_transaction(connection, commands, raise_on_error)
        await self.confirmations.confirm(connection)
        return response

    async def _execute_pipeline(
        self, connection: Connection, commands: Any, raise_on_error: bool
    ) -> Any:
        response = await super()._execute_pipeline(connection, commands, raise_on_error)
        if any(writes(args[0]) for args, _ in commands):
            await self.confirmations.confirm(connection)
        return response


class ReplicatedRedis(aioredis.Redis):
    """``aioredis.Redis`` that waits for ``confirmations.replicas`` after each write."""

    confirmations: Confirmations

    async def _send_command_parse_response(
        self, conn: Connection, command_name: Any, *args: Any, **options: Any
    ) -> Any:
        task = asyncio.current_task()
        cancels = task.cancelling() if task else 0
        try:
            response = await super()._send_command_parse_response(  # type: ignore[no-untyped-call]
                conn, command_name, *args, **options
            )
            if writes(command_name):
                await self.confirmations.confirm(conn)
        finally:
            # A cancel that redis-py swallowed (as shared/store/records.py notes for its pipelines)
            # must still stop the task, or whoever awaits it hangs.
            if task is not None and task.cancelling() > cancels:
                raise asyncio.CancelledError
        return response

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        pipe = ReplicatedPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )
        pipe.confirmations = self.confirmations
        return pipe
