"""The agent's logs subject: a worker's output is readable over NATS while it runs, after it
exited, and under every identity it served in place; unsafe ids and oversized asks are refused."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from unicron.services.agent.logs import LogServer
from unicron.services.agent.supervisor import Worker, WorkerKey
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.logs import LOGS_CHUNK_BYTES, LogsReply, LogsRequest, logs_subject

from tests.agent.conftest import until
from tests.api.live import eventually

NODE = "n1"
LAUNCH = WorkerKey("job-logs", 1, 0)
SPEAKER = "import time\nfor i in range(3): print(f'hello {i}', flush=True)\ntime.sleep(60)\n"


def log_path_in(root: Path) -> Callable[[WorkerKey], Path]:
    def log_path(key: WorkerKey) -> Path:  # the supervisor's layout
        return root / "logs" / key.job_id / f"g{key.generation}-r{key.rank}.log"

    return log_path


@pytest.fixture
async def worker(tmp_path: Path) -> AsyncIterator[Worker]:
    """A process writing to its launch key's log, as the supervisor would start it."""
    path = tmp_path / "logs" / LAUNCH.job_id / "g1-r0.log"
    path.parent.mkdir(parents=True)
    with path.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", SPEAKER, stdout=out)
    yield Worker(LAUNCH, proc, LAUNCH.generation)
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


@pytest.fixture
async def server(tmp_path: Path, worker: Worker, bus: Bus) -> LogServer:
    def running(launch: WorkerKey) -> bool:
        return launch == worker.key and worker.alive

    logs = LogServer(NODE, log_path_in(tmp_path), running)
    await logs.serve(bus)
    return logs


async def ask(bus: Bus, payload: bytes | LogsRequest) -> tuple[LogsReply, int]:
    raw = payload if isinstance(payload, bytes) else payload.model_dump_json().encode()
    msg = await bus.nc.request(logs_subject(NODE), raw, timeout=5)
    return LogsReply.model_validate_json(msg.data), len(msg.data)


async def read_all(bus: Bus, generation: int, rank: int) -> LogsReply:
    reply, _ = await ask(bus, LogsRequest(job_id=LAUNCH.job_id, generation=generation, rank=rank))
    return reply


async def all_said(bus: Bus) -> LogsReply:
    """The launch key's reply once the worker has printed all its lines."""

    async def probe() -> LogsReply | None:
        reply = await read_all(bus, 1, 0)
        return reply if b"hello 2" in reply.data else None

    said = await eventually(probe)
    assert said is not None
    return said


async def test_output_is_served_while_running_and_after_exit(
    server: LogServer, worker: Worker, bus: Bus
) -> None:
    reply = await all_said(bus)
    assert reply.data == b"hello 0\nhello 1\nhello 2\n"
    assert (reply.found, reply.running, reply.complete) == (True, True, False)

    worker.proc.kill()
    await worker.proc.wait()
    done = await read_all(bus, 1, 0)
    assert done.data == reply.data
    assert (done.found, done.running, done.complete) == (True, False, True)
    never = await read_all(bus, 1, 1)
    assert (never.found, never.data) == (False, b"")


async def test_a_regrouped_worker_is_found_under_each_identity(
    server: LogServer, worker: Worker, bus: Bus
) -> None:
    await until(lambda: worker.proc.returncode is None)
    worker.generation, worker.rank = 2, 1  # as Supervisor.regroup leaves it
    server.regrouped(worker)
    worker.generation, worker.rank = 3, 0
    server.regrouped(worker)
    first = await all_said(bus)
    for generation, rank in ((2, 1), (3, 0)):
        served = await read_all(bus, generation, rank)
        assert (served.data, served.running) == (first.data, True), (generation, rank)
    worker.proc.kill()
    await worker.proc.wait()
    after = await read_all(bus, 2, 1)
    assert (after.data, after.running, after.complete) == (first.data, False, True)
    assert not (await read_all(bus, 2, 0)).found


@pytest.mark.parametrize("job_id", ["../escape", ".hidden", "a/b", "~spare", ""])
async def test_unsafe_job_ids_are_refused(server: LogServer, bus: Bus, job_id: str) -> None:
    reply, _ = await ask(bus, LogsRequest(job_id=job_id, generation=1, rank=0))
    assert reply.error is not None and "not a safe name" in reply.error
    assert (reply.found, reply.data) == (False, b"")


async def test_replies_are_bounded_and_tails_count_lines(
    server: LogServer, tmp_path: Path, bus: Bus
) -> None:
    big = tmp_path / "logs" / LAUNCH.job_id / "g4-r0.log"
    lines = b"".join(b"line %d\n" % i for i in range(20))
    big.write_bytes(b"\x00" * (3 * LOGS_CHUNK_BYTES) + b"\n" + lines)
    whole, raw_size = await ask(bus, LogsRequest(job_id=LAUNCH.job_id, generation=4, rank=0))
    assert len(whole.data) == LOGS_CHUNK_BYTES and whole.next_offset == LOGS_CHUNK_BYTES
    assert raw_size < bus.nc.max_payload and raw_size < 400 * 1024

    tail = LogsRequest(job_id=LAUNCH.job_id, generation=4, rank=0, tail=5)
    last5, _ = await ask(bus, tail)
    assert last5.data == b"".join(b"line %d\n" % i for i in range(15, 20))
    assert last5.next_offset == last5.size == big.stat().st_size
    nothing, _ = await ask(bus, tail.model_copy(update={"tail": 0}))
    assert (nothing.data, nothing.offset) == (b"", big.stat().st_size)

    too_much = b'{"job_id": "job-logs", "generation": 4, "rank": 0, "max_bytes": 1048576}'
    refused, _ = await ask(bus, too_much)
    assert refused.error is not None and "max_bytes" in refused.error
    garbage, _ = await ask(bus, b"not json")
    assert garbage.error is not None and "invalid logs request" in garbage.error
