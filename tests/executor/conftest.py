"""An in-process executor on the real NATS and Redis of tests/conftest.py, and fake agents:
each consumes its node's command subject, records what it got, and lets a test answer with the
reports a real agent (and its workers) would send."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from unicron.services.executor.service import Executor
from unicron.services.executor.settings import ExecutorSettings
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.contracts.events import CloudEvent, EventData
from unicron.shared.contracts.messages import AGENT_COMMAND, AnyAgentCommand, command_subject
from unicron.shared.contracts.models import (
    FailureRecord,
    Job,
    JobSpec,
    JobState,
    ModelConfig,
    NodeRecord,
    PlanAction,
    WorkerRecord,
    WorkerState,
)
from unicron.shared.contracts.plans import JobAllocation, Plan
from unicron.shared.contracts.reports import REPORT, REPORT_SUBJECT_PREFIX
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.store.lease import EXECUTOR_LEASE
from unicron.shared.store.state import StateStore

from tests.agent.conftest import agent, joined  # noqa: F401  (fixtures: a real agent process)

C = TypeVar("C", bound=AnyAgentCommand)
E = TypeVar("E", bound=EventData)
NODES = ("n0", "n1")
PORTS = {"n0": 41000, "n1": 41001}


class FakeAgent:
    """Records the commands sent to one node, in order."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.commands: list[AnyAgentCommand] = []
        self._arrived = asyncio.Condition()

    async def take(self, command: AnyAgentCommand) -> None:
        async with self._arrived:
            self.commands.append(command)
            self._arrived.notify_all()

    async def wait(
        self, match: Callable[[list[AnyAgentCommand]], bool], within: float = 10
    ) -> None:
        async with asyncio.timeout(within), self._arrived:
            await self._arrived.wait_for(lambda: match(self.commands))

    def of(self, cls: type[C]) -> list[C]:
        return [c for c in self.commands if isinstance(c, cls)]


class Events:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[CloudEvent] = asyncio.Queue()

    async def put(self, event: CloudEvent) -> None:
        await self.queue.put(event)

    async def next(self, cls: type[E], within: float = 10, **fields: object) -> E:
        async with asyncio.timeout(within):
            while True:
                event = await self.queue.get()
                if event.type != cls.TYPE:
                    continue
                data = event.typed()
                assert isinstance(data, cls)
                if all(getattr(data, k) == v for k, v in fields.items()):
                    return data


@pytest.fixture
async def executor(bus: Bus, state: StateStore, tmp_path: Path) -> AsyncIterator[Executor]:
    """Wired as ``unicron.services.executor.service.run`` wires it, without the reconcile loop,
    holding the executor lease for the test's length."""
    settings = ExecutorSettings(data_dir=tmp_path, regroup_timeout_s=5.0)
    lease = state.lease(EXECUTOR_LEASE, ttl_s=3600)
    assert await lease.try_acquire()
    ex = Executor(bus, state, settings, lease)
    await bus.consume("unicron.events.plan.created", "executor", parse_event, ex.on_event)
    await bus.consume(
        "unicron.events.failure.detected", "executor-failures", parse_event, ex.on_event
    )
    await bus.consume(
        f"{REPORT_SUBJECT_PREFIX}>", "executor-reports", REPORT.validate_json,
        ex.progress.on_report, batch=ex.progress.on_reports,
    )  # fmt: skip
    yield ex


@pytest.fixture
async def agents(bus: Bus, state: StateStore) -> dict[str, FakeAgent]:
    fakes = {}
    for node_id in NODES:
        await state.put_node(
            NodeRecord(id=node_id, slots=2, store_port=PORTS[node_id], boot_id=f"boot-{node_id}")
        )
        fake = FakeAgent(node_id)
        await bus.consume(
            command_subject(node_id), f"agent-{node_id}", AGENT_COMMAND.validate_json, fake.take
        )
        fakes[node_id] = fake
    return fakes


@pytest.fixture
async def events(bus: Bus) -> Events:
    box = Events()
    await bus.consume("unicron.events.>", "test-events", parse_event, box.put, deliver_new=True)
    return box


def spec() -> JobSpec:
    return JobSpec(
        name="regroup", steps=1000, global_batch=8, micro_batch=2, min_workers=1, max_workers=4,
        model=ModelConfig(n_layer=1, n_head=1, d_model=8, seq_len=4, vocab=8),
    )  # fmt: skip


async def running_job(
    state: StateStore, placement: list[str], job_id: str = "job-r", generation: int = 1
) -> Job:
    """A job whose generation has stepped, one RUNNING worker per rank of ``placement``."""
    job = Job(
        id=job_id, name="regroup", spec=spec(), state=JobState.RUNNING, step=12,
        generation=generation, world_size=len(placement), stepping=True, plan_id="plan-old",
        workers=[
            WorkerRecord(rank=r, node_id=n, pid=1000 + r, state=WorkerState.RUNNING)
            for r, n in enumerate(placement)
        ],
    )  # fmt: skip
    await state.create_job(job)
    return job


async def fail(
    state: StateStore,
    job_id: str,
    action: str,
    rank: int | None,
    kind: str = "crash",
    node_id: str | None = None,
    dead: tuple[int, ...] = (),
) -> Job:
    """Record a failure of the job's generation as the detector would, and the dead ranks."""

    def mark(job: Job) -> bool:
        job.last_failure = FailureRecord(
            failure_id=f"{job_id}:{job.generation}", generation=job.generation, kind=kind,
            category="exited_abnormally", severity="SEV2", action=action, rank=rank,
            node_id=node_id, observed_at=job.submitted_at + 1,
        )  # fmt: skip
        for r in dead:
            job.workers[r].state = WorkerState.FAILED
        job.set_state(JobState.RECOVERING, f"{kind}", by=ServiceRole.DETECTOR)
        return True

    updated = await state.update_job(job_id, mark)
    assert updated is not None
    return updated


async def apply(
    executor: Executor, state: StateStore, job: Job, action: PlanAction, nodes: list[str]
) -> Plan:
    """Store a plan for the job and let the executor carry it out."""
    plan = Plan(
        seq=await state.next_plan_seq(),
        allocations=[
            JobAllocation(
                job_id=job.id, workers=len(nodes), nodes=nodes, action=action,
                generation=job.generation, previous_workers=job.world_size,
            )
        ],
    )  # fmt: skip
    await state.save_plan(plan)
    await executor.transitions.apply_plan(plan)
    return plan


async def job_where(state: StateStore, job_id: str, ok: object, within: float = 30) -> Job:
    found: list[Job] = []

    async def probe() -> bool:
        job = await state.get_job(job_id)
        if job is not None and ok(job):  # type: ignore[operator]
            found.append(job)
            return True
        return False

    async with asyncio.timeout(within):
        # job records have no push channel of their own; Redis is polled, bounded
        while not await probe():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    return found[0]
