"""In-place regroups: ``RegroupWorker`` commands delivered to one live worker as a
``RegroupDirective`` line (docs/design.md §5: survivors keep their process and memory).

The worker is found by who it is now (a worker may re-form several times); once the directive
is on its way the supervisor knows it by its new (generation, rank), so later stops, fault
drills, hang reports and its exit report use that identity. Applying the same regroup twice
(a redelivered command) does nothing; a regroup for a worker this node does not run, or whose
channel is not connected, can never succeed and is rejected (dead-lettered by the agent).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from unicron.services.agent.api import WorkerLink
from unicron.services.agent.supervisor import CommandRejectedError, Supervisor, Worker
from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.messages import RegroupWorker
from unicron.shared.logging import get_logger

log = get_logger(component="regroup")
REMEMBERED = 4096  # regroups kept to drop a redelivered command


class Regrouper:
    def __init__(
        self,
        channel: WorkerLink,
        supervisor: Supervisor,
        on_regroup: Callable[[Worker], None] = lambda _worker: None,
    ) -> None:
        self.channel = channel
        self.supervisor = supervisor
        self.on_regroup = on_regroup
        self._done: OrderedDict[tuple[str, int, int], None] = OrderedDict()

    async def regroup(self, cmd: RegroupWorker) -> None:
        directive = cmd.directive
        once = (cmd.job_id, directive.generation, cmd.from_rank)
        rlog = log.bind(job_id=cmd.job_id, generation=directive.generation, rank=directive.rank)
        if once in self._done:
            rlog.info("duplicate regroup ignored", from_rank=cmd.from_rank)
            return
        old = WorkerKey(cmd.job_id, cmd.from_generation, cmd.from_rank)
        worker = self.supervisor.find(old)
        if worker is None:
            raise CommandRejectedError(
                f"no live worker {_name(old)} on this node to regroup into "
                f"g{directive.generation} r{directive.rank}"
            )
        if worker.generation >= directive.generation:
            rlog.info("worker already at or past this generation", at=worker.generation)
            self._remember(once)
            return
        sent = False
        for key in dict.fromkeys((worker.current, worker.key, old)):
            if await self.channel.send_to_worker(key, directive):
                sent = True
                break
        if not sent:
            raise CommandRejectedError(
                f"worker {_name(old)} (pid {worker.proc.pid}) has no connected channel; "
                "cannot deliver the regroup"
            )
        self.supervisor.regroup(worker, directive.generation, directive.rank)
        self.on_regroup(worker)
        self._remember(once)
        rlog.info(
            "regroup sent to worker",
            from_generation=cmd.from_generation,
            from_rank=cmd.from_rank,
            world_size=directive.world_size,
            state_source_rank=directive.state_source_rank,
        )

    def _remember(self, once: tuple[str, int, int]) -> None:
        self._done[once] = None
        if len(self._done) > REMEMBERED:
            self._done.popitem(last=False)


def _name(key: WorkerKey) -> str:
    return f"{key.job_id} g{key.generation} r{key.rank}"
