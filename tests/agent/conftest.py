"""Helpers for the agent's tests: a sink that records what the agent would publish, commands
that launch the stdlib fake worker (``tests/agent/fake_worker.py``) with the job record they
name, and the fixtures that run the agent itself as a process (``tests/agent/process.py`` holds
its environment and the inbox to await what it publishes)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest
from unicron.services.agent.channel import WorkerChannel
from unicron.services.agent.hang import HangWatch
from unicron.services.agent.launch import JobContext
from unicron.services.agent.outbox import Report
from unicron.services.agent.registry import EntrypointRegistry
from unicron.services.agent.settings import AgentSettings
from unicron.services.agent.spares import SparePool
from unicron.services.agent.supervisor import Supervisor
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.contracts.events import CloudEvent, NodeJoined
from unicron.shared.contracts.messages import DeadLetter, Rendezvous, StartWorker
from unicron.shared.contracts.models import Job, JobSpec, JobState
from unicron.shared.contracts.reports import REPORT
from unicron.shared.contracts.workerchannel import AnyWorkerDirective, parse_directive
from unicron.shared.store.state import StateStore

from tests.agent.process import FAKE_WORKER, NODE, REPO, Heard, agent_env, inbox

R = TypeVar("R", bound=Report)


class RecordingSink:
    """Stands in for the outbox: reports and dead letters land in queues."""

    def __init__(self) -> None:
        self.reports: asyncio.Queue[Report] = asyncio.Queue()
        self.letters: asyncio.Queue[tuple[str, bytes, str]] = asyncio.Queue()

    def report(self, report: Report) -> None:
        self.reports.put_nowait(report)

    def dead_letter(self, subject: str, payload: bytes, reason: str) -> None:
        self.letters.put_nowait((subject, payload, reason))

    async def next(self, cls: type[R], within: float = 10.0) -> R:
        """The next report of type ``cls``, skipping others."""
        async with asyncio.timeout(within):
            while True:
                report = await self.reports.get()
                if isinstance(report, cls):
                    return report

    async def gather(self, *wanted: type[Report], within: float = 10.0) -> list[Report]:
        """One report of each type in ``wanted`` (a type may repeat), in whatever order they
        arrive, others skipped: under load a worker's exit may beat its last channel lines
        past the agent's bounded wait for them (test_supervisor checks the order itself)."""
        need, got = list(wanted), []
        async with asyncio.timeout(within):
            while need:
                report = await self.reports.get()
                match = next((cls for cls in need if isinstance(report, cls)), None)
                if match is not None:
                    need.remove(match)
                    got.append(report)
        return got


def directives(log: Path) -> list[AnyWorkerDirective]:
    """The directives a fake worker logged as ``directive <line>``, in the order it got them."""
    prefix = "directive "
    lines = log.read_text().splitlines()
    return [parse_directive(line.removeprefix(prefix)) for line in lines if line.startswith(prefix)]


async def until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    """Wait for a condition that has no event to await, with a deadline."""
    async with asyncio.timeout(within):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.01)


class Start(NamedTuple):
    """A start command and the job record's context the agent would resolve for it."""

    cmd: StartWorker
    ctx: JobContext


def start_cmd(
    job_id: str,
    behaviour: str,
    generation: int = 1,
    rank: int = 0,
    steps: int = 1,
    **spec: Any,
) -> Start:
    """A start of the fake worker; ``spec`` sets more JobSpec fields (checkpoint_every …)."""
    cmd = StartWorker(
        job_id=job_id,
        generation=generation,
        rank=rank,
        world_size=rank + 1,
        rendezvous=Rendezvous(host="127.0.0.1", port=29500, prefix=f"{job_id}/g{generation}"),
    )
    spec_ = JobSpec(name=behaviour, steps=steps, **spec)
    return Start(cmd, JobContext(spec_, Path(f"/tmp/ckpt/{job_id}")))


async def record_job(state: StateStore, start: Start) -> None:
    """Store the job record the start names, at its generation: the agent reads it from there."""
    cmd = start.cmd
    job = Job(
        id=cmd.job_id,
        name=start.ctx.spec.name,
        spec=start.ctx.spec,
        generation=cmd.generation,
        state=JobState.STARTING,
    )
    await state.create_job(job)


async def send_start(bus: Bus, state: StateStore, start: Start) -> None:
    """Record the job, then send the start to the agent under test."""
    await record_job(state, start)
    await bus.send_command(NODE, start.cmd)


@pytest.fixture(autouse=True)
def _importable_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers are spawned with the agent's env: let them import ``tests.agent.fake_worker``."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture
async def channel(tmp_path: Path, sink: RecordingSink) -> AsyncIterator[WorkerChannel]:
    chan = WorkerChannel(tmp_path / "agents" / "n1.sock", "n1", sink)
    await chan.start()
    yield chan
    await chan.close()


@pytest.fixture
async def supervisor(
    tmp_path: Path, sink: RecordingSink, channel: WorkerChannel
) -> AsyncIterator[Supervisor]:
    """A supervisor wired to a running channel, as the agent wires them."""
    registry = EntrypointRegistry({"gpt": FAKE_WORKER})
    sup = Supervisor("n1", tmp_path, registry, channel.path, sink, drained=channel.drained)
    channel.identify = sup.identify
    channel.on_generation = sup.advance
    yield sup
    await sup.shutdown()


@contextlib.asynccontextmanager
async def spare_pool(
    argv: list[str],
    supervisor: Supervisor,
    channel: WorkerChannel,
    data_dir: Path,
    count: int = 1,
    delay_s: float = 0.0,
) -> AsyncIterator[SparePool]:
    """``count`` warm spares of ``argv``, wired to the supervisor and channel as the agent
    wires them."""
    pool = SparePool(count, argv, channel.path, data_dir, supervisor.slots, channel, delay_s)
    supervisor.launcher.spares = pool
    channel.identify = lambda pid: supervisor.identify(pid) or pool.identify(pid)
    pool.start()
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def watch(
    supervisor: Supervisor, channel: WorkerChannel, sink: RecordingSink
) -> AsyncIterator[HangWatch]:
    """Hang detection with the default settings, fed by the channel as the agent wires it."""
    hangs = HangWatch(AgentSettings(node_id="n1"), supervisor.live, sink)
    channel.observe = hangs.observe
    task = asyncio.create_task(hangs.run())
    yield hangs
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# --- the agent as a process, against the real servers of tests/conftest.py ---------------


@pytest.fixture
async def heard(bus: Bus) -> Heard:
    reports = await inbox(bus, f"unicron.reports.{NODE}.>", REPORT.validate_json)
    return Heard(reports, await inbox(bus, "unicron.deadletter", DeadLetter.model_validate_json))


@pytest.fixture
def agent(nats_url: str, redis_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    data_dir = tmp_path / "data"
    with (tmp_path / "agent.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "unicron.services.agent"],
            cwd=REPO,
            env=agent_env(nats_url, redis_url, data_dir),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    print((tmp_path / "agent.log").read_text()[-4000:])


@pytest.fixture
async def joined(bus: Bus, agent: subprocess.Popen[bytes]) -> NodeJoined:
    events = await inbox(bus, "unicron.events.node.joined", parse_event)
    # generous: the agent imports torch for its TCPStore, slow on a loaded machine
    event = await events.next(lambda e: isinstance(e, CloudEvent), within=60)
    assert isinstance(event, CloudEvent)
    data = event.typed()
    assert isinstance(data, NodeJoined)
    return data
