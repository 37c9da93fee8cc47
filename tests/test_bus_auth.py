"""The bus refuses what a user may not say or hear: a real nats-server, started with the
configuration ``unicron up`` renders, enforces each role's permissions (docs/design.md §11).

A refused publish is answered by the server with a permissions error (and no message lands in
any stream); a JetStream publish that is refused gets no acknowledgement at all.
"""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from nats.aio.msg import Msg
from pydantic import SecretStr
from unicron.shared.bus.bus import Bus
from unicron.shared.bus.natslogin import NatsAccess
from unicron.shared.contracts.events import CloudEvent, FailureDetected, JobSubmitted, PlanCreated
from unicron.shared.contracts.messages import (
    FaultKind,
    FaultSpec,
    InjectFault,
    Rendezvous,
    StartWorker,
    StopWorkers,
    command_subject,
)
from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.reports import WorkerExited, report_subject
from unicron.shared.contracts.roles import CredentialsError, ServiceUser
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind, RecoveryAction, Severity
from unicron.shared.servers.embedded import EmbeddedServer

from tests.secured import (
    ADMIN,
    AGENT_0,
    AGENT_1,
    API,
    DETECTOR,
    EXECUTOR,
    PLANNER,
    api,
    bus_of,
    counts,
    login,
    secured,
)

__all__ = ["api", "secured"]  # fixtures


def _event(data: FailureDetected | PlanCreated | JobSubmitted) -> tuple[str, bytes]:
    event = CloudEvent.wrap(data, "unicron/forger")
    return event.nats_subject, event.model_dump_json().encode()


FAILURE = _event(
    FailureDetected(
        failure_id="f-forged", job_id="job-1", node_id="node-1", rank=0,
        kind=FailureKind.CRASH, category=FailureCategory.ECC, severity=Severity.SEV1,
        action=RecoveryAction.RECONFIGURE, observed_at=time.time(),
    )
)  # fmt: skip
PLAN = _event(
    PlanCreated(plan_id="p-forged", seq=99, epoch=99, trigger="x", expected_waf=1.0, jobs=[])
)
SUBMITTED = _event(JobSubmitted(job_id="job-forged", name="x", spec=JobSpec(name="x")))
START = StartWorker(
    job_id="job-forged", generation=1, rank=0, world_size=1,
    rendezvous=Rendezvous(host="127.0.0.1", port=1, prefix="g1"),
)  # fmt: skip
CRASH = FaultSpec(rank=0, kind=FaultKind.CRASH)
FAULT = InjectFault(job_id="job-1", generation=1, rank=0, fault=CRASH)
EXIT_0 = WorkerExited(node_id="node-1", job_id="job-1", generation=1, rank=0, pid=1, exit_code=0)


def _command(node_id: str, command: StartWorker | StopWorkers | InjectFault) -> tuple[str, bytes]:
    return command_subject(node_id), command.model_dump_json().encode()


# What the attacker forged with an agent's (or no) credentials.
FORGERIES = {
    "StartWorker for another node": _command("node-1", START),
    "StartWorker for its own node": _command("node-0", START),
    "StopWorkers": _command("node-1", StopWorkers(job_id="job-1")),
    "InjectFault": _command("node-1", FAULT),
    "exit-0 report as another node": (report_subject(EXIT_0), EXIT_0.model_dump_json().encode()),
    "failure.detected": FAILURE,
    "plan.created": PLAN,
    "job.submitted": SUBMITTED,
}


async def test_anonymous_and_wrong_passwords_are_refused_at_once(secured: EmbeddedServer) -> None:
    started = time.monotonic()
    with pytest.raises(CredentialsError, match=r"anonymous client.*set UNICRON_NATS_USER"):
        await Bus.connect(secured.url, "unicron/test", connect_timeout_s=20)
    wrong = NatsAccess(user="agent-node-0", password=SecretStr("guessed"))
    with pytest.raises(CredentialsError, match=r"'agent-node-0'.*UNICRON_NATS_PASSWORD"):
        await Bus.connect(secured.url, "unicron/test", connect_timeout_s=20, access=wrong)
    assert time.monotonic() - started < 5  # not a retry loop until the timeout


async def test_an_agent_cannot_forge_commands_reports_failures_or_plans(
    secured: EmbeddedServer, api: Bus
) -> None:
    before = await counts(secured)
    async with login(secured, AGENT_0) as agent:
        for what, (subject, payload) in FORGERIES.items():
            await agent.nc.publish(subject, payload)
            assert await agent.refused(subject), f"{what} was not refused"
        with pytest.raises(nats.errors.TimeoutError):  # JetStream: no acknowledgement at all
            await agent.js().publish(*FORGERIES["StartWorker for another node"])
    assert await counts(secured) == before  # nothing landed in any stream


@pytest.mark.parametrize(
    ("subject", "payload", "publishers"),
    [
        (*FAILURE, {DETECTOR}),
        (*PLAN, {PLANNER}),
        (*_command("node-0", FAULT), {EXECUTOR, API}),  # the API's admin fault path
        (*SUBMITTED, {API}),
        (report_subject(EXIT_0), EXIT_0.model_dump_json().encode(), {AGENT_1}),
    ],
    ids=["failure.detected", "plan.created", "commands", "job.submitted", "node-1 report"],
)
async def test_each_subject_has_exactly_its_publishers(
    secured: EmbeddedServer, api: Bus, subject: str, payload: bytes, publishers: set[ServiceUser]
) -> None:
    for user in (API, DETECTOR, PLANNER, EXECUTOR, AGENT_0, AGENT_1):
        async with login(secured, user) as client:
            if user in publishers:
                ack = await client.js().publish(subject, payload)  # stored, acknowledged
                assert ack.seq > 0
            else:
                await client.nc.publish(subject, payload)
                assert await client.refused(subject), f"{user.name} may publish {subject}"


async def test_an_agent_hears_only_its_own_commands(secured: EmbeddedServer, api: Bus) -> None:
    async with (
        login(secured, AGENT_0) as agent,
        bus_of(secured, AGENT_1) as node_1,
        bus_of(secured, EXECUTOR) as executor,
    ):
        heard: asyncio.Queue[Msg] = asyncio.Queue()
        own: asyncio.Queue[StopWorkers] = asyncio.Queue()
        for subject in (command_subject("node-1"), "_INBOX.agent-node-1.>", "_INBOX.>", ">"):
            await agent.nc.subscribe(subject, cb=heard.put)
            assert await agent.refused(subject), f"agent-node-0 may subscribe to {subject}"
        with pytest.raises(nats.errors.TimeoutError):  # no consumer on the events stream
            await agent.js().subscribe("unicron.events.>")
        with pytest.raises(nats.errors.TimeoutError):  # nor its own name on node-1's commands
            await agent.js().add_consumer(
                "UNICRON_COMMANDS", name="agent-node-0", durable_name="agent-node-0",
                filter_subject=command_subject("node-1"), deliver_subject="_INBOX.agent-node-0.x",
            )  # fmt: skip
        await node_1.consume(command_subject("node-1"), "agent-node-1", _stop, own.put)
        await executor.send_command("node-1", StopWorkers(job_id="job-1", reason="real"))
        assert (await asyncio.wait_for(own.get(), 10)).reason == "real"
        await agent.nc.flush()
        assert heard.empty()
        async with login(secured, ADMIN) as admin:
            info = await admin.js().stream_info("UNICRON_EVENTS")
            assert info.state.consumer_count == 0


def _stop(raw: bytes) -> StopWorkers:
    return StopWorkers.model_validate_json(raw)


async def test_an_agent_cannot_point_its_own_consumer_at_another_node(
    secured: EmbeddedServer, api: Bus
) -> None:
    async with login(secured, AGENT_0) as agent:
        with pytest.raises(nats.errors.TimeoutError):
            await agent.js().add_consumer(
                "UNICRON_COMMANDS", durable_name="agent-node-0",
                filter_subject=command_subject("node-1"), deliver_subject="_INBOX.agent-node-0.x",
            )  # fmt: skip
