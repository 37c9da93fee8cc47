"""Records and listeners the API and CLI tests share: a running job in Redis, an agent's
command queue on the bus, and the tokens of a secured API."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
from pydantic import ValidationError
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.messages import (
    AGENT_COMMAND,
    AgentCommand,
    FaultKind,
    FaultSpec,
    InjectFault,
    command_subject,
)
from unicron.shared.contracts.models import Job, JobSpec, JobState, WorkerRecord, WorkerState
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.store.state import StateStore

ADMIN = "admin-token-0123456789abcdef"
USER_A = "user-a-token-0123456789abcdef"
USER_B = "user-b-token-0123456789abcdef"
TOKENS = {
    ADMIN: {"role": "admin", "tenant": "ops"},
    USER_A: {"role": "user", "tenant": "team-a"},
    USER_B: {"role": "user", "tenant": "team-b"},
}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def moved(*states: JobState, reason: str = "") -> Callable[[Job], bool]:
    """A record update that moves the job along ``states`` as the executor would, each step a
    move of the lifecycle (shared/contracts/lifecycle.py); the last one records ``reason``."""

    def move(job: Job) -> bool:
        for state in states:
            why = reason if state == states[-1] and reason else f"to {state.value}"
            assert job.set_state(state, why, by=ServiceRole.EXECUTOR), (job.state, state)
        return True

    return move


async def put_job(
    state: StateStore,
    job_id: str,
    nodes: tuple[str, ...] = ("node-a", "node-b"),
    job_state: JobState = JobState.RUNNING,
    generation: int = 3,
) -> Job:
    """A job as the executor leaves it: one RUNNING worker per rank on ``nodes``."""
    job = Job(
        id=job_id,
        name="drill",
        spec=JobSpec(name="drill"),
        state=job_state,
        generation=generation,
        world_size=len(nodes),
        workers=[
            WorkerRecord(rank=r, node_id=n, pid=100 + r, state=WorkerState.RUNNING)
            for r, n in enumerate(nodes)
        ],
    )
    created, _ = await state.create_job(job)
    return created


Received = AgentCommand | ValidationError


def parse_command(raw: bytes) -> Received:
    """As the agent parses it; a command it could not parse is returned, not dead-lettered,
    so the test fails at once with pydantic's reason instead of timing out."""
    try:
        return AGENT_COMMAND.validate_json(raw)
    except ValidationError as exc:
        return exc


async def command_queue(bus: Bus, node_id: str) -> asyncio.Queue[Received]:
    """Every command sent to ``node_id``'s agent, as the agent would parse it."""
    queue: asyncio.Queue[Received] = asyncio.Queue()
    await bus.consume(
        command_subject(node_id), durable=f"test-{node_id}", parse=parse_command,
        handler=queue.put,
    )  # fmt: skip
    return queue


def fault_round_trips() -> bool:
    """Whether an agent can parse the InjectFault the API sends. Not yet: FaultSpec dumps its
    defaults (message, exit_code, slowdown), and its validator then takes them as set for the
    wrong kind. The fix belongs in shared/contracts/messages.py."""
    fault = FaultSpec(rank=0, kind=FaultKind.CRASH)
    command = InjectFault(job_id="job-x", generation=1, rank=0, fault=fault)
    return not isinstance(parse_command(command.model_dump_json().encode()), ValidationError)


async def commands_sent(bus: Bus) -> int:
    """How many agent commands the stream holds: proves that a refused request sent none."""
    info = await bus.js.stream_info("UNICRON_COMMANDS")
    return int(info.state.messages)


async def says_not_found(client: httpx.AsyncClient, path: str, words: str) -> bool:
    """Whether GET ``path`` is a 404 whose detail says ``words``."""
    response = await client.get(path)
    return response.status_code == 404 and words in response.json()["detail"]
