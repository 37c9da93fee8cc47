"""Helpers for the agent's tests: a sink that records what the agent would publish, and
commands that launch the stdlib fake worker (``tests/agent/fake_worker.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from services.agent.channel import WorkerChannel
from services.agent.outbox import Report
from services.agent.registry import EntrypointRegistry
from services.agent.supervisor import Supervisor
from shared.messages import Rendezvous, StartWorker
from shared.models import JobSpec

R = TypeVar("R", bound=Report)
REPO = Path(__file__).resolve().parents[2]
FAKE_WORKER = "tests.agent.fake_worker"


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


async def until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    """Wait for a condition that has no event to await, with a deadline."""
    async with asyncio.timeout(within):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.01)


def start_cmd(
    job_id: str, behaviour: str, generation: int = 1, rank: int = 0, steps: int = 1
) -> StartWorker:
    return StartWorker(
        job_id=job_id,
        generation=generation,
        rank=rank,
        world_size=rank + 1,
        spec=JobSpec(name=behaviour, steps=steps),
        rendezvous=Rendezvous(host="127.0.0.1", port=29500, prefix=f"{job_id}/g{generation}"),
        checkpoint_dir=f"/tmp/ckpt/{job_id}",
    )


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
    sup = Supervisor("n1", tmp_path, registry, channel.path, sink)
    channel.identify = sup.identify
    channel.on_generation = sup.advance
    yield sup
    await sup.shutdown()
