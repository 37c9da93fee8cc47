"""A fleet of simulated node agents in one process, for ``bench/scale.py``.

Each node (``bench/scale_nodes.py``) speaks the real agent protocol over the real bus and store:
its own durable command consumer on ``UNICRON_COMMANDS`` (as an agent's NATS user has), the
detector's ping, its record and heartbeat in Redis, its ranks' reports on ``UNICRON_REPORTS``
(their steps in one ``StepsCompleted`` per node per step, as the agent's batcher sends them).
The ranks of a generation step together once all of them joined — across fleets, which count
their joined ranks to each other on core NATS, as the rendezvous store does for real ranks —
and stop when one of them failed.

The driver reaches the fleets on core NATS: ``bench.scale.fault`` (every fleet: the owner of the
node injects, the others report as peers), ``bench.scale.revive``, and per fleet
``bench.scale.<index>.commands`` (when the commands of a job's generations arrived) and
``.status`` (their names: ``bench/scale_wire.py``).
Run: ``python -m bench.scale_fleet --index 0 --first 0 --count 512 …``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
from collections import defaultdict

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from unicron.shared.bus.bus import Bus
from unicron.shared.bus.streams import COMMANDS_STREAM
from unicron.shared.contracts.events import NodeJoined
from unicron.shared.contracts.identity import WorkerKey, who
from unicron.shared.contracts.messages import (
    AGENT_COMMAND,
    RegroupWorker,
    StartWorker,
    StopWorkers,
    command_subject,
)
from unicron.shared.contracts.models import now
from unicron.shared.contracts.reports import AnyReport, StepCompleted, StepsCompleted
from unicron.shared.logging import configure_logging
from unicron.shared.store.state import StateStore

from bench.scale_nodes import SimNode
from bench.scale_wire import FAULT_SUBJECT, JOINED_SUBJECT, REVIVE_SUBJECT, Arrivals, node_name

PUBLISH_BATCH = 512
REDIS_AT_ONCE = 32
Generation = tuple[str, int]


class Fleet:
    def __init__(self, index: int, nodes: list[SimNode], bus: Bus, state: StateStore,
                 step_s: float, heartbeat_s: float) -> None:  # fmt: skip
        self.index = index
        self.nodes = {n.node_id: n for n in nodes}
        self.bus, self.state = bus, state
        self.step_s, self.heartbeat_s = step_s, heartbeat_s
        self.steps: dict[str, int] = {}  # job → the last step its ranks here completed
        self.next_step_at: dict[Generation, float] = {}
        self.joined: dict[Generation, dict[int, int]] = defaultdict(dict)  # fleet → ranks
        self.worlds: dict[Generation, int] = {}
        self.arrivals: dict[Generation, Arrivals] = defaultdict(Arrivals)
        self.published = 0
        self._dirty: set[Generation] = set()
        self._redis = asyncio.Semaphore(REDIS_AT_ONCE)  # within the client's connection pool
        self._wake_at = 0.0  # when the stepping loop next has work: now, after any change

    # --- start ------------------------------------------------------------------------------

    async def start(self) -> None:
        nc = self.bus.nc
        await nc.subscribe("unicron.agents.*.ping", cb=self._ping)
        await nc.subscribe(FAULT_SUBJECT, cb=self._fault)
        await nc.subscribe(REVIVE_SUBJECT, cb=self._revive)
        await nc.subscribe(JOINED_SUBJECT, cb=self._on_joined)
        await nc.subscribe(f"bench.scale.{self.index}.commands", cb=self._commands_asked)
        await nc.subscribe(f"bench.scale.{self.index}.status", cb=self._status_asked)
        for node in self.nodes.values():  # each node's own consumer, as an agent has
            # the server pushes only to a subscriber of the very subject, not of a wildcard
            deliver = f"bench.fleet.{self.index}.cmd.{node.node_id}"
            await nc.subscribe(deliver, cb=self._command)
            await self.bus.js.add_consumer(COMMANDS_STREAM, ConsumerConfig(
                durable_name=f"scale-{node.node_id}", filter_subject=command_subject(node.node_id),
                deliver_subject=deliver,
                deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.EXPLICIT, ack_wait=5.0,
            ))  # fmt: skip
        await asyncio.gather(*(self._register(n) for n in self.nodes.values()))

    async def _register(self, node: SimNode) -> None:
        async with self._redis:
            await self.state.put_node(node.record())
        joined = NodeJoined(node_id=node.node_id, slots=node.slots, host="127.0.0.1",
                            boot_id=node.boot_id)  # fmt: skip
        await self.bus.publish_event(joined)

    # --- loops --------------------------------------------------------------------------------

    async def heartbeats(self) -> None:
        """Each node beats once per interval, the nodes spread over it as real ones are."""
        order = list(self.nodes.values())
        gap = self.heartbeat_s / max(1, len(order))

        async def beat(node: SimNode) -> None:
            async with self._redis:
                if await self.state.update_node(node.node_id, node.beat) is None:
                    await self.state.put_node(node.record())

        pending: set[asyncio.Task[None]] = set()
        clock = asyncio.get_running_loop().time
        while True:
            started = clock()
            for position, node in enumerate(order):
                delay = started + position * gap - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                if node.alive:
                    task = asyncio.create_task(beat(node))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
            await asyncio.sleep(max(0.0, started + self.heartbeat_s - clock()))

    async def stepping(self) -> None:
        while True:
            await asyncio.sleep(0.02)
            if self._dirty:
                dirty, self._dirty = self._dirty, set()
                for gen in dirty:
                    count = sum(1 for n in self.nodes.values() for k in n.ranks if k[:2] == gen)
                    payload = json.dumps([self.index, gen[0], gen[1], count]).encode()
                    await self.bus.nc.publish(JOINED_SUBJECT, payload)
            await self._step_due()

    async def _step_due(self) -> None:
        """Step every generation whose step is due. The scan over every rank runs only when a
        step is due or something changed: ten thousand ranks every 20 ms starved the fleet."""
        at = now()
        if at < self._wake_at:
            return
        self._wake_at = float("inf")
        live: dict[Generation, list[tuple[SimNode, WorkerKey]]] = defaultdict(list)
        broken: set[Generation] = set()
        for node in self.nodes.values():
            for key, rank in node.ranks.items() if node.alive else ():
                if rank.parked:
                    broken.add(key[:2])
                else:
                    live[key[:2]].append((node, key))
        reports: list[AnyReport] = []
        for gen, ranks in live.items():
            if gen in broken or sum(self.joined[gen].values()) < self.worlds.get(gen, 1 << 30):
                continue
            due = self.next_step_at.setdefault(gen, at)
            if at >= due:
                due = self.next_step_at[gen] = due + self.step_s
                reports += self._steps_of(gen, ranks)
            self._wake_at = min(self._wake_at, due)
        await self.publish(reports)

    def _steps_of(self, gen: Generation, ranks: list[tuple[SimNode, WorkerKey]]) -> list[AnyReport]:
        step = self.steps[gen[0]] = self.steps.get(gen[0], 0) + 1
        by_node: dict[str, list[StepCompleted]] = defaultdict(list)
        for node, key in ranks:  # one message per node, as the agent's batcher sends
            by_node[node.node_id].append(self._step(node, key, step))
        return [StepsCompleted.of(steps) for steps in by_node.values()]

    def _step(self, node: SimNode, key: WorkerKey, step: int) -> StepCompleted:
        return StepCompleted(
            **who(node.node_id, key), step=step, loss=1.0 / step, iteration_s=self.step_s,
            compute_s=0.8 * self.step_s,
        )  # fmt: skip

    async def publish(self, reports: list[AnyReport]) -> None:
        for start in range(0, len(reports), PUBLISH_BATCH):
            batch = reports[start : start + PUBLISH_BATCH]
            await asyncio.gather(*(self.bus.publish_report(r) for r in batch))
            self.published += len(batch)

    # --- commands -----------------------------------------------------------------------------

    async def _command(self, msg: Msg) -> None:
        self._wake_at = 0.0
        node = self.nodes[msg.subject.rsplit(".", 1)[-1]]  # the command's own subject
        if not node.alive:
            await msg.ack()  # lost with the node; its next boot starts with nothing
            return
        cmd = AGENT_COMMAND.validate_json(msg.data)
        reports: list[AnyReport] = []
        if isinstance(cmd, StartWorker):
            self._arrived(cmd.job_id, cmd.generation, cmd.world_size)
            reports = node.start(cmd, self.steps.get(cmd.job_id, 0) + 1)
        elif isinstance(cmd, RegroupWorker):
            gen = cmd.directive
            self._arrived(gen.job_id, gen.generation, gen.world_size)
            reports = node.regroup(cmd, self.steps.get(cmd.job_id, 0) + 1)
        elif isinstance(cmd, StopWorkers):
            reports = node.stop(cmd)
        await self.publish(reports)
        await msg.ack()

    def _arrived(self, job_id: str, generation: int, world_size: int) -> None:
        gen = (job_id, generation)
        self.arrivals[gen].add(now())
        self.worlds[gen] = world_size
        self._dirty.add(gen)

    async def _on_joined(self, msg: Msg) -> None:
        self._wake_at = 0.0
        fleet, job_id, generation, count = json.loads(msg.data)
        self.joined[(job_id, generation)][fleet] = count

    async def _ping(self, msg: Msg) -> None:
        node = self.nodes.get(msg.subject.split(".")[2])
        if node is not None and node.alive and msg.reply:
            await msg.respond(node.boot_id.encode())

    # --- the driver's requests ----------------------------------------------------------------

    async def _fault(self, msg: Msg) -> None:
        self._wake_at = 0.0
        ask = json.loads(msg.data)
        key = WorkerKey(ask["job_id"], ask["generation"], ask["rank"])
        node = self.nodes.get(ask["node_id"])
        if node is not None:  # the rank's own report goes first, as it would in a real fault
            await self.publish(node.fault_reports(ask["kind"], key))
        peers: list[AnyReport] = []
        for other in self.nodes.values():
            if other.alive:
                peers += other.peer_reports(ask["kind"], key.job_id, key.generation)
        await self.publish(peers)

    async def _revive(self, msg: Msg) -> None:
        self._wake_at = 0.0
        node = self.nodes.get(msg.data.decode())
        if node is not None and not node.alive:
            node.reboot()
            await self._register(node)

    async def _commands_asked(self, msg: Msg) -> None:
        job_id = msg.data.decode()
        found = {g: vars(a) for (j, g), a in self.arrivals.items() if j == job_id}
        await msg.respond(json.dumps(found).encode())

    async def _status_asked(self, msg: Msg) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        status = {
            "nodes": len(self.nodes), "alive": sum(n.alive for n in self.nodes.values()),
            "ranks": sum(len(n.ranks) for n in self.nodes.values()),
            "published": self.published, "cpu_s": usage.ru_utime + usage.ru_stime,
        }  # fmt: skip
        await msg.respond(json.dumps(status).encode())


async def main(args: argparse.Namespace) -> None:
    configure_logging("scale-fleet", "WARNING")
    bus = await Bus.connect(args.nats, f"unicron/scale-fleet-{args.index}")
    state = await StateStore.connect(args.redis)
    nodes = [SimNode(node_name(i), args.slots) for i in range(args.first, args.first + args.count)]
    fleet = Fleet(args.index, nodes, bus, state, args.step_s, args.heartbeat_s)
    await fleet.start()
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    tasks = [asyncio.create_task(fleet.heartbeats()), asyncio.create_task(fleet.stepping())]
    await stop.wait()
    for task in tasks:
        task.cancel()
    await bus.close()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--first", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--nats", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--step-s", type=float, default=10.0)
    parser.add_argument("--heartbeat-s", type=float, default=1.0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
