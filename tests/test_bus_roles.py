"""Least privilege still lets every role do its whole job: each hop of a fault's path, and the
side paths (pings, log requests, packages, stream replays, the SSE tail, dead letters), under
the logins ``unicron up`` generates, with nothing refused (docs/design.md §11)."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from pathlib import Path
from typing import TypeVar

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from structlog.testing import capture_logs
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.bus.packages import get_package, put_package
from unicron.shared.contracts.events import (
    CloudEvent,
    FailureDetected,
    JobSubmitted,
    NodeJoined,
    PlanCreated,
)
from unicron.shared.contracts.logs import logs_subject
from unicron.shared.contracts.messages import StopWorkers, command_subject, ping_subject
from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.reports import WORKER_REPORT, AnyWorkerReport, WorkerExited
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind, RecoveryAction, Severity
from unicron.shared.contracts.webhooks import WEBHOOKS_CHANGED_SUBJECT, WebhookChanged
from unicron.shared.servers.embedded import EmbeddedServer, start_nats

from tests.secured import (
    AGENT_0,
    AGENT_1,
    API,
    CREDENTIALS,
    DETECTOR,
    EXECUTOR,
    PLANNER,
    USERS,
    access,
    api,
    bus_of,
    secured,
    self_signed,
)

__all__ = ["api", "secured"]  # fixtures
T = TypeVar("T")
PLANS = "unicron.events.plan.created"


async def _heard(queue: asyncio.Queue[T]) -> T:
    return await asyncio.wait_for(queue.get(), 10)


def _stop(raw: bytes) -> StopWorkers:
    return StopWorkers.model_validate_json(raw)


async def test_every_role_still_does_its_own_work(
    secured: EmbeddedServer, api: Bus, tmp_path: Path
) -> None:
    with capture_logs() as logs:
        async with (
            bus_of(secured, DETECTOR) as detector, bus_of(secured, PLANNER) as planner,
            bus_of(secured, EXECUTOR) as executor, bus_of(secured, AGENT_0) as agent,
        ):  # fmt: skip
            events: asyncio.Queue[CloudEvent] = asyncio.Queue()
            plans: asyncio.Queue[CloudEvent] = asyncio.Queue()
            commands: asyncio.Queue[StopWorkers] = asyncio.Queue()
            reports: asyncio.Queue[AnyWorkerReport] = asyncio.Queue()
            await planner.consume("unicron.events.>", "planner", parse_event, events.put)
            await executor.consume(PLANS, "executor", parse_event, plans.put)
            await agent.consume(command_subject("node-0"), "agent-node-0", _stop, commands.put)
            await detector.consume(
                "unicron.reports.*.worker_exited", "detector-worker_exited",
                WORKER_REPORT.validate_json, reports.put,
            )  # fmt: skip
            await api.publish_event(JobSubmitted(job_id="job-1", name="a", spec=JobSpec(name="a")))
            assert (await _heard(events)).type == "job.submitted"
            plan = PlanCreated(plan_id="p1", seq=1, epoch=1, trigger="t", expected_waf=1, jobs=[])
            await planner.publish_event(plan)
            assert (await _heard(plans)).id == "plan.created:p1"
            await executor.send_command("node-0", StopWorkers(job_id="job-1", reason="plan"))
            assert (await _heard(commands)).reason == "plan"
            await agent.publish_report(_exited())
            assert (await _heard(reports)).node_id == "node-0"
            await agent.publish_event(NodeJoined(node_id="node-0", slots=2, host="h", boot_id="b"))
            await detector.publish_event(_failure())
            await agent.dead_letter(command_subject("node-0"), b"{", "unreadable", 1)
            await _answers(agent, detector, api)
            await _announces(api)
            sha, _ = await put_package(api.js, b"the user's code")
            assert await get_package(agent.js, sha) == b"the user's code"
            await _snapshots(agent, secured, tmp_path)
            await _replays(executor, api)
    refusals = [entry for entry in logs if entry["event"] == "nats refused a subject to this user"]
    assert refusals == []


def _exited() -> WorkerExited:
    return WorkerExited(node_id="node-0", job_id="job-1", generation=1, rank=0, pid=1, exit_code=1)


def _failure() -> FailureDetected:
    return FailureDetected(
        failure_id="f1", job_id="job-1", node_id="node-0", rank=0, kind=FailureKind.EXIT,
        category=FailureCategory.EXITED_ABNORMALLY, severity=Severity.SEV2,
        action=RecoveryAction.RESTART, observed_at=time.time(),
    )  # fmt: skip


async def _announces(api: Bus) -> None:
    """An API replica hears the webhook changes its peers announce (api/webhook_sync.py)."""
    notices: asyncio.Queue[Msg] = asyncio.Queue()
    await api.nc.subscribe(WEBHOOKS_CHANGED_SUBJECT, cb=notices.put)
    await api.nc.flush()
    notice = WebhookChanged(webhook_id="wh-1").model_dump_json().encode()
    await api.nc.publish(WEBHOOKS_CHANGED_SUBJECT, notice)
    assert (await _heard(notices)).data == notice


async def _answers(agent: Bus, detector: Bus, api: Bus) -> None:
    """An agent answers the detector's ping and the API's log request."""

    async def respond(msg: Msg) -> None:
        await msg.respond(b"here")

    for subject in (ping_subject("node-0"), logs_subject("node-0")):
        await agent.nc.subscribe(subject, cb=respond)
    await agent.nc.flush()  # the server knows the subscriptions before anyone asks
    assert (await detector.nc.request(ping_subject("node-0"), b"", timeout=5)).data == b"here"
    assert (await api.nc.request(logs_subject("node-0"), b"{}", timeout=5)).data == b"here"


async def _snapshots(agent: Bus, secured: EmbeddedServer, tmp_path: Path) -> None:
    """A script's checkpoint snapshot: one agent writes and replaces it, another reads it."""
    tar = tmp_path / "snapshot.tar"
    tar.write_bytes(b"a checkpoint directory")
    mine = agent.checkpoint_objects()
    await mine.put_file("job-1/1.tar", tar)
    await mine.put_bytes("job-1/manifest.json", b"first")
    await mine.put_bytes("job-1/manifest.json", b"second")  # a put that replaces purges
    async with bus_of(secured, AGENT_1) as other:
        theirs = other.checkpoint_objects()
        assert await theirs.get_bytes("job-1/manifest.json") == b"second"
        assert await theirs.get_file("job-1/1.tar", tmp_path / "fetched.tar")
        assert (tmp_path / "fetched.tar").read_bytes() == b"a checkpoint directory"
        await theirs.delete("job-1/1.tar")
    assert await mine.get_bytes("job-1/1.tar") is None


async def _replays(executor: Bus, api: Bus) -> None:
    """The executor's rebuild reads the streams back; the API tails the events for SSE."""
    last = await executor.js.get_last_msg("UNICRON_EVENTS", PLANS)
    assert b"p1" in (last.data or b"")
    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    replay = await executor.js.subscribe("unicron.events.>", ordered_consumer=True, config=config)
    assert b"job.submitted" in (await replay.next_msg(timeout=5)).data
    await replay.unsubscribe()
    async with aclosing(api.tail_events(after_seq=0)) as tail:
        seq, first = await anext(tail)
    assert (seq, first.type) == (1, "job.submitted")


async def test_a_tls_server_serves_the_same_logins(tmp_path: Path) -> None:
    tls = self_signed(tmp_path)
    server = start_nats(tmp_path / "nats", logins=CREDENTIALS.nats_logins(USERS), tls=tls)
    try:
        assert server.url.startswith("tls://")
        trusted = access(API).model_copy(update={"tls_ca": tls.cert})
        bus = await Bus.connect(server.url, "unicron/test", 10, trusted)
        assert bus.nc.connected_url is not None and bus.nc.connected_url.scheme == "tls"
        await bus.close()
    finally:
        server.stop()
