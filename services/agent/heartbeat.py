"""The node's record in Redis as this boot of the agent keeps it: registration and heartbeat.

A new boot keeps nothing of an old record but the id and an operator's decision: a drain, or a
quarantine that has not run out (a restart must not lift it). Each heartbeat refreshes the
record with the workers the node runs, so a control plane whose Redis lost the job records can
re-adopt or stop them and never hands their slots out twice (docs/design.md §6). A record that
vanished (Redis lost its data) is written again on the next beat.
"""

from __future__ import annotations

from collections.abc import Callable

from unicron.services.agent.master import MasterStores
from unicron.services.agent.outbox import Outbox
from unicron.services.agent.settings import AgentSettings
from unicron.services.agent.spares import SparePool
from unicron.services.agent.supervisor import Supervisor
from unicron.shared.contracts.events import NodeJoined
from unicron.shared.contracts.models import NodeRecord, NodeState, NodeWorker, now
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.logging import get_logger
from unicron.shared.store.state import StateStore

log = get_logger(component="agent")


class NodeRegistration:
    def __init__(
        self,
        settings: AgentSettings,
        state: StateStore,
        outbox: Outbox,
        boot_id: str,
        supervisor: Supervisor,
        spares: SparePool,
        masters: MasterStores,
        host: str,
        store_port: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.state = state
        self.outbox = outbox
        self.boot_id = boot_id
        self.supervisor = supervisor
        self.spares = spares
        self.masters = masters
        self.host = host  # the advertised address (unicron.services.agent.address)
        self.store_port = store_port
        self.registered = False

    def fresh_record(self) -> NodeRecord:
        # the slots as found once the devices were known (unicron.services.agent.gpus)
        pool = self.supervisor.slots
        return NodeRecord(
            id=self.node_id,
            state=NodeState.READY,
            slots=pool.count,
            gpus=pool.gpus,
            used=len(self.supervisor.live()),
            last_heartbeat=now(),
            host=self.host,
            store_port=self.store_port(),
            boot_id=self.boot_id,
            workers=self.inventory(),
        )

    def inventory(self) -> list[NodeWorker]:
        """Every worker running here, by the identity it runs under now."""
        return [NodeWorker(**w.current._asdict(), pid=w.proc.pid) for w in self.supervisor.live()]

    def _take_over(self, node: NodeRecord) -> bool:
        """Make an earlier boot's record this boot's, keeping an operator's decision."""
        fresh = self.fresh_record()
        keep = node.state == NodeState.DRAINED or (
            node.state == NodeState.QUARANTINED and (node.quarantined_until or 0.0) > now()
        )
        if keep:
            fresh.quarantined_until = node.quarantined_until
            log.warning("node stays out of service", state=node.state.value)
        else:
            node.set_state(NodeState.READY, "a new boot registered", by=ServiceRole.AGENT)
        for name in NodeRecord.model_fields.keys() - {"state"}:  # moved above, if at all
            setattr(node, name, getattr(fresh, name))
        return True

    def _beat(self, node: NodeRecord) -> bool:
        if node.boot_id != self.boot_id:
            return False  # another boot of this node took the record over; leave it be
        node.last_heartbeat = now()
        node.used = len(self.supervisor.live())
        node.slots = self.supervisor.slots.count  # one fewer for each GPU retired as faulty
        node.retired_gpus = self.supervisor.slots.retired_devices()
        node.workers = self.inventory()
        node.spares_ready = len(self.spares.ready())
        return True

    async def beat(self) -> None:
        """Register (again, if the record vanished) or refresh the record."""
        self.masters.sweep(
            {(w.current.job_id, w.current.generation) for w in self.supervisor.live()}
        )
        if self.registered:
            node = await self.state.update_node(self.node_id, self._beat)
            if node is not None:
                if node.boot_id != self.boot_id:
                    log.error("node record taken over by another boot", other=node.boot_id)
                return
            log.warning("node record missing; registering again")
            await self.state.put_node(self.fresh_record())
            return
        # this boot's first registration: an earlier boot's record is taken over atomically
        if await self.state.update_node(self.node_id, self._take_over) is None:
            await self.state.put_node(self.fresh_record())
        self.registered = True
        self.outbox.event(
            NodeJoined(
                node_id=self.node_id,
                slots=self.supervisor.slots.count,
                host=self.host,
                boot_id=self.boot_id,
            )
        )
        log.info("node registered", boot_id=self.boot_id, store_port=self.store_port())
