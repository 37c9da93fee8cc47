"""A Redis lease with a fencing epoch: one active holder of a role, the others wait.

The lease is one key, ``<prefix>lease:<name>``, holding the holder's id with a TTL; the epoch
is a counter, ``<prefix>lease:<name>:epoch``, incremented each time a *new* holder takes the
lease. The holder stamps its decisions with its epoch; whoever acts on them compares that epoch
with :func:`current_epoch` and refuses anything older (a holder that paused past its TTL and
came back cannot undo its successor's work). All steps are single Lua scripts, so acquire and
renew are atomic with respect to each other and to expiry.

States (``LeaseState``): STANDBY → ACTIVE (acquired) → STANDBY (renew failed: expired or taken
over) | RELEASED (released on shutdown). A standby polls every ``ttl/10``, so after the holder
dies its successor is active within ``1.1 ttl``.

A process that a supervisor restarts (``unicron up``, a Kubernetes pod restarted in place) can
name its ``instance``: the supervisor never runs two processes of one instance at once, so a
holder of the same instance is a dead predecessor, and the successor takes the lease over at
once, with a new epoch that fences anything the predecessor left in flight, instead of waiting
out the TTL in the middle of a recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from enum import Enum

import redis.asyncio as aioredis
from unicron.shared.logging import get_logger
from unicron.shared.outage import Outage

# KEYS[1] lease, KEYS[2] epoch; ARGV[1] holder, ARGV[2] ttl ms, ARGV[3] the holder's instance
# prefix ("" for none). Returns the epoch, or 0.
_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
local predecessor = ARGV[3] ~= '' and holder and string.sub(holder, 1, #ARGV[3]) == ARGV[3]
if holder and not predecessor then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return redis.call('INCR', KEYS[2])
"""
# Renew only while still the holder and the epoch is ours. Returns 1 or 0.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[3]) then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

PLANNER_LEASE = "planner"  # the one writer of plans (docs/design.md §6)
EXECUTOR_LEASE = "executor"  # the one instance carrying plans out

log = get_logger(component="lease")


class LeaseState(str, Enum):
    """STANDBY → ACTIVE → STANDBY | RELEASED (see the module docstring)."""

    STANDBY = "STANDBY"
    ACTIVE = "ACTIVE"
    RELEASED = "RELEASED"


def holder_id() -> str:
    """A name for this process that no other process (here or elsewhere) shares."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def lease_keys(name: str, prefix: str) -> list[str]:
    lease = f"{prefix}lease:{name}"
    return [lease, f"{lease}:epoch"]


async def current_epoch(client: aioredis.Redis, name: str, prefix: str = "unicron:") -> int:
    """The epoch of the latest holder of ``name``; 0 when nobody ever held it."""
    return int(await client.get(lease_keys(name, prefix)[1]) or 0)


class Lease:
    def __init__(
        self,
        client: aioredis.Redis,
        name: str,
        ttl_s: float,
        holder: str | None = None,
        prefix: str = "unicron:",
        instance: str | None = None,
    ) -> None:
        self.redis = client
        self.name = name
        self.ttl_ms = max(1, int(ttl_s * 1000))
        # "<instance>/" starts the holder id, so a successor of the same instance knows it
        self.instance_prefix = f"{instance}/" if instance else ""
        self.holder = self.instance_prefix + (holder or holder_id())
        self.keys = lease_keys(name, prefix)
        self.epoch = 0
        self.state = LeaseState.STANDBY
        # Until this monotonic instant the lease is surely ours (renewed before it, minus
        # a margin for clock drift between us and Redis).
        self._valid_until = 0.0

    @property
    def ttl_s(self) -> float:
        return self.ttl_ms / 1000

    def held(self) -> bool:
        """True while this process may act as the holder (checked before each decision)."""
        return self.state == LeaseState.ACTIVE and time.monotonic() < self._valid_until

    def _mark(self, started: float) -> None:
        self._valid_until = started + 0.9 * self.ttl_s

    async def try_acquire(self) -> bool:
        started = time.monotonic()
        args = (self.holder, self.ttl_ms, self.instance_prefix)
        epoch = int(await self.redis.eval(_ACQUIRE, 2, *self.keys, *args))
        if not epoch:
            return False
        self.epoch, self.state = epoch, LeaseState.ACTIVE
        self._mark(started)
        return True

    async def renew(self) -> bool:
        """Extend the lease; False (and STANDBY) when it expired or someone else holds it."""
        started = time.monotonic()
        args = (self.holder, self.ttl_ms, self.epoch)
        if int(await self.redis.eval(_RENEW, 2, *self.keys, *args)):
            self._mark(started)
            return True
        self.state = LeaseState.STANDBY
        return False

    async def release(self) -> None:
        if self.state == LeaseState.ACTIVE:
            with contextlib.suppress(Exception):  # Redis may be gone; the TTL ends it anyway
                await self.redis.eval(_RELEASE, 2, *self.keys, self.holder)
        self.state = LeaseState.RELEASED

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait as a standby until the lease is ours (True) or ``stop`` is set (False)."""
        waiting_logged = False
        outage = Outage("lease acquire", component="lease", name=self.name)
        while not stop.is_set():
            try:
                acquired = await self.try_acquire()
                outage.ok()
                if acquired:
                    log.info("lease acquired", name=self.name, epoch=self.epoch)
                    return True
            except Exception as exc:  # Redis away: stay standby and retry
                outage.failed(exc)
            if not waiting_logged:
                log.info("standing by: another instance holds the lease", name=self.name)
                waiting_logged = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.ttl_s / 10)
        return False

    async def keep(self, stop: asyncio.Event) -> None:
        """Renew every ttl/3 until ``stop`` is set or the lease is lost (then return)."""
        outage = Outage("lease renew", component="lease", name=self.name)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.ttl_s / 3)
            if stop.is_set():
                return
            try:
                renewed = await self.renew()
                outage.ok()
            except Exception as exc:
                renewed = self.held()  # a blip: keep going while the lease surely still holds
                outage.failed(exc)
            if not renewed:
                self.state = LeaseState.STANDBY
                log.warning("lease lost", name=self.name, epoch=self.epoch)
                return
