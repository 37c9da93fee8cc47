"""Fault drills: ``InjectFault`` commands delivered to one worker as a ``FaultDirective`` line.

The worker runtime carries the fault out itself (crash, exit, exception, hang, slow), so it
fails the way a real fault would fail it. A fault for a worker this node does not run, or whose
local channel is not connected, can never succeed and is rejected — except ``crash``, which
the agent carries out with SIGKILL. Faults from outside the system (a real ``kill -STOP``)
need nothing here: supervision and hang detection report them like any other.
"""

from __future__ import annotations

from collections import OrderedDict

from unicron.services.agent.api import WorkerLink
from unicron.services.agent.supervisor import CommandRejectedError, Supervisor, Worker
from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.messages import FaultKind, InjectFault
from unicron.shared.contracts.workerchannel import FaultDirective
from unicron.shared.logging import get_logger

log = get_logger(component="faults")
REMEMBERED = 1024  # command ids kept to drop a redelivered drill


class FaultInjector:
    def __init__(self, channel: WorkerLink, supervisor: Supervisor) -> None:
        self.channel = channel
        self.supervisor = supervisor
        self._done: OrderedDict[str, None] = OrderedDict()

    async def inject(self, cmd: InjectFault) -> None:
        """Deliver the fault once; raise ``CommandRejectedError`` when it cannot be."""
        if cmd.command_id in self._done:
            # at-least-once delivery must not turn one drill into two faults
            log.info("duplicate fault ignored", command_id=cmd.command_id)
            return
        key = cmd.key
        flog = log.bind(job_id=cmd.job_id, generation=cmd.generation, rank=cmd.rank)
        worker = self.supervisor.find(self.channel.launched_as(key) or key)
        if worker is None:
            raise CommandRejectedError(f"no live worker {_name(key)} on this node")
        directive = FaultDirective(fault=cmd.fault)
        if await self._send(worker, key, directive):
            flog.info("fault sent to worker", fault=cmd.fault.kind.value)
        elif cmd.fault.kind == FaultKind.CRASH:
            self.supervisor.crash(worker)
        else:
            raise CommandRejectedError(
                f"worker {_name(key)} has no connected channel; "
                f"cannot deliver a {cmd.fault.kind.value} fault"
            )
        self._done[cmd.command_id] = None
        if len(self._done) > REMEMBERED:
            self._done.popitem(last=False)

    async def _send(self, worker: Worker, key: WorkerKey, directive: FaultDirective) -> bool:
        """Send by the identity the command names, or by the one the worker connected with (a
        worker told to regroup is reachable before it reports under its new identity)."""
        for ident in dict.fromkeys((key, worker.current, worker.key)):
            if await self.channel.send_to_worker(ident, directive):
                return True
        return False


def _name(key: WorkerKey) -> str:
    return f"{key.job_id} g{key.generation} r{key.rank}"
