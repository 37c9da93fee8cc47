"""The agent's service body: registers the node, heartbeats, and serves commands.

On start it hosts the node's rendezvous store at the address peers reach it at
(``unicron.services.agent.address``) and checks that it answers there, hosts the workers' local
channel, finds the node's GPUs, registers the node (``unicron.services.agent.heartbeat``) and
announces ``node.joined``. The heartbeat only needs Redis and the outbox only needs NATS, so either
going away stops neither; commands arrive on the node's durable consumer, one at a time. Hang
detection watches the workers' steps for as long as the agent runs, and a heartbeat silent for
``node_timeout_s`` stops every worker (``unicron.services.agent.fence``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid

import structlog
from unicron.services.agent.address import AddressError, advertised_host
from unicron.services.agent.channel import WorkerChannel
from unicron.services.agent.failures import launch_failure_reports
from unicron.services.agent.faults import FaultInjector
from unicron.services.agent.fence import Fence, round_trip
from unicron.services.agent.gpuhealth import GpuHealthWatch
from unicron.services.agent.gpuowners import GpuOwners
from unicron.services.agent.gpus import SlotPool, SlotsError, visible_devices
from unicron.services.agent.hang import HangWatch
from unicron.services.agent.heartbeat import NodeRegistration
from unicron.services.agent.logs import LogServer
from unicron.services.agent.master import MasterStores
from unicron.services.agent.metrics import AgentMetrics
from unicron.services.agent.mirror import CheckpointMirror
from unicron.services.agent.outbox import Outbox, Report
from unicron.services.agent.packages import PackageDirs
from unicron.services.agent.prepare import LaunchRefusedError, StartPreparer
from unicron.services.agent.registry import build_registry
from unicron.services.agent.regroup import Regrouper
from unicron.services.agent.settings import AgentSettings
from unicron.services.agent.snapshots import snapshot_store
from unicron.services.agent.spares import SparePool
from unicron.services.agent.steps import StepBatcher
from unicron.services.agent.store import RendezvousStore, StorePortsExhaustedError
from unicron.services.agent.supervisor import CommandRejectedError, Supervisor, Worker
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.messages import (
    AGENT_COMMAND,
    AnyAgentCommand,
    InjectFault,
    RegroupWorker,
    StartWorker,
    StopWorkers,
    command_subject,
    ping_subject,
)
from unicron.shared.contracts.roles import agent_user
from unicron.shared.logging import get_logger
from unicron.shared.outage import Outage
from unicron.shared.store.state import StateStore
from unicron.shared.tasks import cancel_and_wait

log = get_logger(component="agent")


class Agent:
    def __init__(self, settings: AgentSettings, bus: Bus, state: StateStore) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.bus = bus
        self.state = state
        self.boot_id = uuid.uuid4().hex
        self.outbox = Outbox(bus)
        self.steps = StepBatcher(self.outbox, self._local_ranks)  # every worker report: through it
        self.host = advertised_host(settings.host, settings.nats_url)
        ports = settings.store_port_choice
        self.store = RendezvousStore(self.host, ports, settings.store_bind_host)
        # absolute: workers get this path in their launch JSON and may change directory
        socket_path = (settings.data_dir / "agents" / f"{self.node_id}.sock").absolute()
        self.slots = SlotPool(slots=settings.slots)  # the devices come once run() found them
        # The channel asks the supervisor and the spares who a connecting process is, and the
        # spares reach their processes through the channel: the agent's methods below stand
        # between them, so each part is whole when it is made.
        self.channel = WorkerChannel(
            socket_path,
            self.node_id,
            self.steps,
            identify=self._identify,
            on_generation=self._advance,
            observe=self._observe,
        )
        registry = build_registry(settings.entrypoints)
        # Spares run no trainer of their own: each launch names the job's (``supervisor``).
        self.spares = SparePool(
            settings.spares,  # None: one per slot
            [sys.executable, "-m", settings.spare_module],
            socket_path,
            settings.data_dir,
            self.slots,
            self.channel,
            settings.spare_delay_s,
        )
        self.supervisor = Supervisor(
            self.node_id, settings.data_dir, registry, socket_path, self.steps,
            self.slots, self.spares, self.channel.drained,
        )  # fmt: skip
        self.hangs = HangWatch(settings, self.supervisor.live, self.steps)
        metrics = bus.metrics.part(AgentMetrics)
        metrics.spares_from(lambda: len(self.spares.ready()))
        owners = GpuOwners(
            self.node_id, self.slots, self.supervisor.live, metrics.counting(self.outbox)
        )
        self.gpu_health = GpuHealthWatch(self.node_id, self.boot_id, owners, settings.gpu_health_s)
        self.masters = MasterStores(self.host, self.store.bind_host, ports)
        packages = PackageDirs(bus, settings.data_dir)
        checkpoints = (settings.data_dir / "checkpoints").absolute()
        url = settings.checkpoint_url
        self.mirror = CheckpointMirror(
            snapshot_store(url, bus.checkpoint_objects), checkpoints, self.node_id,
            self.supervisor.live, self._job_over, settings.checkpoint_mirror_s,
            None if url else settings.checkpoint_mirror_max_bytes,
        )  # fmt: skip
        restore = self.mirror.restore if settings.checkpoint_mirror_s > 0 else None
        self.preparer = StartPreparer(state, packages, self.masters, checkpoints, restore)
        self.faults = FaultInjector(self.channel, self.supervisor)
        self.logs = LogServer.of(self.supervisor)
        self.regroups = Regrouper(self.channel, self.supervisor, on_regroup=self._regrouped)
        # a getter: the tests host one store for several agents and swap it in after this
        self.registration = NodeRegistration(
            settings, state, self.outbox, self.boot_id, self.supervisor, self.spares,
            self.masters, host=self.host, store_port=lambda: self.store.port,
        )  # fmt: skip
        self.fence = Fence(
            self.node_id,
            settings.node_timeout_s,
            lambda: self.supervisor.stop_all(settings.stop_wait_s),
            round_trip(bus),
        )
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self, stop: asyncio.Event) -> None:
        self.outbox.start()
        try:
            await self.store.start_reachable()
            # after the store: torch is imported by then, and this needs it
            devices = await asyncio.to_thread(visible_devices)
            self.slots.use(devices, self.settings.slots)  # one rank per GPU: may refuse
            await self.channel.start()
            self.spares.start()
            self._tasks.append(asyncio.create_task(self.hangs.run(), name="hang-watch"))
            self._tasks.append(asyncio.create_task(self.gpu_health.run(), name="gpu-health"))
            self._tasks.append(asyncio.create_task(self.fence.run(), name="fence"))
            if self.settings.checkpoint_mirror_s > 0:
                self._tasks.append(asyncio.create_task(self.mirror.run(), name="mirror"))
            await self._register_first()
            # The detector pings agents to tell a dead node from a network error.
            await self.bus.serve(ping_subject(self.node_id), self._pong)
            await self.logs.serve(self.bus)
            await self.bus.consume(
                command_subject(self.node_id),
                durable=agent_user(self.node_id),  # the one consumer its NATS user may make
                parse=AGENT_COMMAND.validate_json,
                handler=self.handle,
            )
            log.info("agent ready", boot_id=self.boot_id, slots=self.slots.count, gpus=devices)
            await self._heartbeat_until(stop)
        finally:
            await self.close()

    async def _pong(self, _request: bytes) -> bytes:
        return self.boot_id.encode()

    async def close(self) -> None:
        # workers killed on the way out are not hangs, and the fence has nothing left to do
        await cancel_and_wait(self._tasks, what="agent loops")
        await self.spares.close(self.settings.stop_wait_s)
        await self.supervisor.shutdown(self.settings.stop_wait_s)
        await self.channel.close()
        self.steps.flush()
        await self.outbox.close()  # lets the workers' exit reports go out first
        self.masters.close_all()
        self.store.close()

    async def _job_over(self, job_id: str) -> bool:
        job = await self.state.get_job(job_id)
        return job is None or job.state.terminal

    def _regrouped(self, worker: Worker) -> None:
        self.hangs.regrouped(worker)
        self.logs.regrouped(worker)

    def _observe(self, launched: WorkerKey | None, report: Report) -> None:
        self.hangs.observe(launched, report)
        self.supervisor.observe(launched, report)

    def _local_ranks(self, job_id: str, generation: int) -> int:
        return sum(w.current[:2] == (job_id, generation) for w in self.supervisor.live())

    def _identify(self, pid: int) -> WorkerKey | None:
        """Who a process that connects to the channel is: a worker, or a warm spare."""
        return self.supervisor.identify(pid) or self.spares.identify(pid)

    def _advance(self, launched: WorkerKey, generation: int) -> None:
        self.supervisor.advance(launched, generation)

    # --- commands ----------------------------------------------------------------------

    async def handle(self, cmd: AnyAgentCommand) -> None:
        """Run one command; a command that can never succeed is dead-lettered, not retried."""
        try:
            if isinstance(cmd, StartWorker):
                if len(self.supervisor.live()) >= self.slots.count:
                    # a GPU node refuses it if no GPU is free (gpus.py); a CPU node runs it
                    log.warning("starting a worker beyond the node's slots", job_id=cmd.job_id)
                await self._start(cmd)
            elif isinstance(cmd, StopWorkers):
                await self.supervisor.stop_workers(cmd, self.settings.stop_wait_s)
                self.masters.close(cmd.job_id, cmd.below_generation)
            elif isinstance(cmd, RegroupWorker):
                await self.regroups.regroup(cmd)
            elif isinstance(cmd, InjectFault):
                await self._inject(cmd)
        except CommandRejectedError as exc:
            payload = cmd.model_dump_json().encode()
            self.outbox.dead_letter(command_subject(self.node_id), payload, str(exc))

    async def _inject(self, cmd: InjectFault) -> None:
        """Only a drill the API marked: it marks the job's generation before it sends the
        command, and only an admin may ask it to (docs/design.md §6)."""
        if await self.state.drill_of(cmd.job_id, cmd.generation) != cmd.command_id:
            raise CommandRejectedError(
                f"fault {cmd.command_id} for {cmd.job_id} generation {cmd.generation} is not a "
                "drill the API marked; refused"
            )
        await self.faults.inject(cmd)

    async def _start(self, cmd: StartWorker) -> None:
        """Start what the job record says, never what a message says (see ``prepare``)."""
        if not self.supervisor.wanted(cmd):
            return
        try:
            ctx = await self.preparer.prepare(cmd)
        except LaunchRefusedError as exc:
            for report in launch_failure_reports(self.node_id, cmd, exc.exc_type, exc.message):
                self.outbox.report(report)
            log.error("worker cannot start", job_id=cmd.job_id, rank=cmd.rank, why=exc.message)
            return
        if ctx is not None:
            await self.supervisor.start_worker(cmd, ctx)

    # --- registration and heartbeat (services/agent/heartbeat.py) -----------------------

    async def heartbeat_once(self) -> None:
        await self.registration.beat()

    async def _register_first(self) -> None:
        """Register before taking commands; if Redis is away, the heartbeat retries it."""
        started = self.fence.clock()
        try:
            await asyncio.wait_for(self.heartbeat_once(), timeout=5.0)
            self.fence.heard(started)
        except Exception as exc:
            log.warning("registration failed; retrying on the next heartbeat", error=repr(exc))

    async def _heartbeat_until(self, stop: asyncio.Event) -> None:
        interval = self.settings.heartbeat_interval_s
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        outage = Outage("heartbeat", component="agent")
        while not stop.is_set():
            next_at += interval
            with contextlib.suppress(TimeoutError):  # the usual case: the tick is due
                await asyncio.wait_for(stop.wait(), max(0.0, next_at - loop.time()))
                return  # stop was set while we waited
            started = self.fence.clock()
            try:
                # Bounded, so a Redis that hangs instead of refusing cannot stall the loop.
                await asyncio.wait_for(self.heartbeat_once(), timeout=max(interval, 1.0))
                self.fence.heard(started)
                outage.ok()
            except Exception as exc:
                outage.failed(exc)
            next_at = max(next_at, loop.time() - interval)  # after a long stall, do not burst


async def run(
    bus: Bus, state: StateStore, stop: asyncio.Event, settings: AgentSettings | None = None
) -> None:
    """The agent as a ``unicron.shared.service.ServiceBody``; settings come from the env by
    default."""
    settings = settings or AgentSettings()
    structlog.contextvars.bind_contextvars(node_id=settings.node_id)
    try:
        await Agent(settings, bus, state).run(stop)
    except (AddressError, SlotsError, StorePortsExhaustedError) as exc:  # no retry helps
        log.error("agent cannot start", error=str(exc))
        raise SystemExit(2) from None
