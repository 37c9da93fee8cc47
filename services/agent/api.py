"""The agent's parts as they see each other: the interfaces they are built against.

The supervisor, the warm spares and the local channel each need a little of another — the
supervisor takes starts from the spares, the spares reach their processes through the channel,
and the channel learns from the supervisor and the spares who a connecting process is. Each
depends on a protocol here, never on another's module, and the agent
(:mod:`unicron.services.agent.agent`) builds them and passes each what it needs when it constructs
it. What the parts share as data is in :mod:`unicron.services.agent.workers`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from unicron.services.agent.workers import SpareClaim
from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.reports import AnyWorkerReport
from unicron.shared.contracts.workerchannel import AnyWorkerDirective, SpareLaunch

Report = AnyWorkerReport

# Who the process with this pid is: a worker the agent launched, or a warm spare.
Identify = Callable[[int], WorkerKey | None]
# The worker launched as the key joined this newer generation in place.
Advance = Callable[[WorkerKey, int], None]
# A report read from the channel, with the launch key of the worker that sent it (if known).
Observe = Callable[[WorkerKey | None, Report], None]
# Wait, at most the given seconds, until every connection of the exited process (pid) is read
# to its end: its last reports land before its exit report.
Drained = Callable[[int, float], Awaitable[None]]
# A core-NATS request's payload to the reply's.
Answer = Callable[[bytes], Awaitable[bytes]]


class Sink(Protocol):
    """What the channel and the supervisor need: fire-and-forget reports and dead letters."""

    def report(self, report: Report) -> None: ...

    def dead_letter(self, subject: str, payload: bytes, reason: str) -> None: ...


class WorkerLink(Protocol):
    """The local channel as the spares, fault drills and regroups use it: a line to one
    connected worker process, found by any identity it has spoken for."""

    def connected(self, key: WorkerKey) -> bool: ...

    def launched_as(self, key: WorkerKey) -> WorkerKey | None: ...

    def adopt(self, old: WorkerKey, new: WorkerKey) -> None: ...

    async def send_to_worker(self, key: WorkerKey, directive: AnyWorkerDirective) -> bool: ...


class SpareSource(Protocol):
    """The warm spares as the supervisor uses them: a start claims one (ready, or else the
    one furthest along in warming up) and then hands it its launch."""

    def claim(self) -> SpareClaim | None: ...

    async def take(
        self, claim: SpareClaim, key: WorkerKey, launch: SpareLaunch, log_path: Path
    ) -> asyncio.subprocess.Process | None: ...

    def drop(self, claim: SpareClaim) -> None: ...


class Replier(Protocol):
    """Core-NATS request/reply, as the log server answers the API
    (``unicron.shared.bus.bus.Bus``)."""

    async def serve(self, subject: str, answer: Answer) -> None: ...


class PackageSource(Protocol):
    """Where job packages come from (``unicron.shared.bus.bus.Bus``, from its object store)."""

    async def package(self, sha256: str) -> bytes: ...


class SnapshotStore(Protocol):
    """Where scripts' checkpoint snapshots are kept (``unicron.services.agent.snapshots``):
    objects by name, each written whole or not at all. A read of a missing object is None or
    False; any other failure raises."""

    async def put_file(self, name: str, path: Path) -> None: ...

    async def put_bytes(self, name: str, data: bytes) -> None: ...

    async def get_bytes(self, name: str) -> bytes | None: ...

    async def get_file(self, name: str, path: Path) -> bool: ...

    async def delete(self, name: str) -> None: ...
