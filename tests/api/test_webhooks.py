"""Webhooks through a real API over real NATS and Redis, to a real HTTP receiver: who may manage
which, what each format looks like, the signature, dead letters (in the webhook's status and on
the dead-letter stream), and that a DELETE stops them."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator

import httpx
import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_http
from cloudevents.core.formats.json import JSONFormat
from nats.js.errors import NotFoundError
from unicron.services.api.webhook_delivery import consumer_name
from unicron.shared.bus.bus import Bus
from unicron.shared.bus.streams import DEADLETTER_STREAM, EVENTS_STREAM
from unicron.shared.contracts.events import FailureDetected, JobSubmitted, NodeJoined
from unicron.shared.contracts.messages import DEADLETTER_SUBJECT, DeadLetter
from unicron.shared.contracts.models import JobSpec, now
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind
from unicron.shared.contracts.webhooks import WebhookDeadLetter
from unicron.shared.store.state import StateStore

from tests.api.factories import ADMIN, USER_A, USER_B, bearer, put_job
from tests.api.live import eventually, serve_api
from tests.api.webhook_receiver import Receiver

SECRET = "a-webhook-secret-0123456789"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    hook = Receiver()
    yield hook
    hook.down()


def submitted(job_id: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, name="w", spec=JobSpec(name="w"))


def failure(job_id: str, tag: str = "") -> FailureDetected:
    return FailureDetected.of(
        FailureCategory.NCCL_TIMEOUT, failure_id=f"f-{job_id}{tag}", job_id=job_id,
        node_id="node-a", rank=1, kind=FailureKind.EXCEPTION, observed_at=now(),
    )  # fmt: skip


async def received(receiver: Receiver, count: int) -> list[str]:
    return await eventually(lambda: _at_least(receiver, count), timeout_s=20)


async def _at_least(receiver: Receiver, count: int) -> list[str]:
    ids = receiver.event_ids()
    return ids if len(ids) >= count else []


async def test_admins_manage_every_webhook_and_users_their_tenants(
    secured: httpx.AsyncClient, state: StateStore, receiver: Receiver
) -> None:
    await put_job(state, "job-a")  # tenant None: only an admin's
    admin, user_a, user_b = bearer(ADMIN), bearer(USER_A), bearer(USER_B)
    spec = {"url": receiver.url, "types": ["failure.detected"], "secret": SECRET}

    assert (await secured.post("/v1/webhooks", json=spec)).status_code == 401
    made = await secured.post("/v1/webhooks", json=spec, headers=user_a)
    assert made.status_code == 201, made.text
    hook = made.json()
    assert hook["secret_set"] is True and "secret" not in hook and SECRET not in made.text
    assert hook["tenant"] == "team-a" and hook["status"]["delivered"] == 0
    by_admin = await secured.post("/v1/webhooks", json={"url": receiver.url}, headers=admin)
    assert by_admin.status_code == 201

    listed = await secured.get("/v1/webhooks", headers=user_a)
    assert [w["id"] for w in listed.json()] == [hook["id"]]
    assert len((await secured.get("/v1/webhooks", headers=admin)).json()) == 2
    assert (await secured.get("/v1/webhooks", headers=user_b)).json() == []
    path = f"/v1/webhooks/{hook['id']}"
    assert (await secured.get(path, headers=user_b)).status_code == 404
    assert (await secured.delete(path, headers=user_b)).status_code == 404
    assert (
        await secured.get(f"/v1/webhooks/{by_admin.json()['id']}", headers=user_a)
    ).status_code == 404
    assert (await secured.get(path, headers=admin)).json()["secret_set"] is True

    plans = await secured.post(
        "/v1/webhooks", json={"url": receiver.url, "types": ["plan.created"]}, headers=user_a
    )
    assert plans.status_code == 403 and "admin" in plans.json()["detail"]
    other_job = {"url": receiver.url, "job_id": "job-a"}
    assert (await secured.post("/v1/webhooks", json=other_job, headers=user_a)).status_code == 404
    unknown = await secured.post(
        "/v1/webhooks", json={"url": receiver.url, "types": ["job.exploded"]}, headers=admin
    )
    assert unknown.status_code == 422
    assert (
        "job.exploded" in unknown.json()["message"]
        and "failure.detected" in unknown.json()["message"]
    )
    for bad in ({"url": "ftp://x/y"}, {"url": receiver.url, "secret": "short"},
                {"url": receiver.url, "format": "xml"}):  # fmt: skip
        assert (await secured.post("/v1/webhooks", json=bad, headers=admin)).status_code == 422

    assert (await secured.delete(path, headers=user_a)).status_code == 204
    assert (await secured.get(path, headers=user_a)).status_code == 404


async def test_cloudevents_are_signed_filtered_and_counted(
    client: httpx.AsyncClient, bus: Bus, receiver: Receiver
) -> None:
    spec = {"url": receiver.url, "types": ["job.submitted"], "job_id": "job-1", "secret": SECRET}
    hook = (await client.post("/v1/webhooks", json=spec)).json()
    await bus.publish_event(submitted("job-2"))  # another job's
    await bus.publish_event(NodeJoined(node_id="node-a", slots=2, host="h", boot_id="b"))
    wanted = await bus.publish_event(submitted("job-1"))

    assert await received(receiver, 1) == [wanted.id]
    got = receiver.snapshot()[0]
    assert got.headers["content-type"] == "application/cloudevents+json"
    expected = hmac.new(SECRET.encode(), got.body, hashlib.sha256).hexdigest()
    assert got.headers["x-unicron-signature"] == f"sha256={expected}"
    event = from_http(HTTPMessage(got.headers, got.body), JSONFormat())  # the SDK reads it
    assert (event.get_id(), event.get_type(), event.get_specversion()) == (
        wanted.id, "job.submitted", "1.0",
    )  # fmt: skip
    data = event.get_data()
    assert isinstance(data, dict) and data["job_id"] == "job-1"

    status = (await client.get(f"/v1/webhooks/{hook['id']}")).json()["status"]
    assert status["delivered"] == 1 and status["last_success_at"] is not None


async def test_slack_and_alertmanager_bodies_describe_the_failure(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    slack, alerts = Receiver(), Receiver()
    try:
        for hook, fmt in ((slack, "slack"), (alerts, "alertmanager")):
            made = await client.post("/v1/webhooks", json={"url": hook.url, "format": fmt})
            assert made.status_code == 201
        event = await bus.publish_event(failure("job-7"))
        await received(slack, 1)
        await received(alerts, 1)
    finally:
        slack.down()
        alerts.down()
    text = slack.snapshot()[0].json()["text"]
    for part in ("failure.detected", "job job-7", "node node-a", "nccl_timeout", "action"):
        assert part in text, text
    payload = alerts.snapshot()[0].json()
    assert payload["version"] == "4" and payload["status"] == "firing"
    assert {"receiver", "groupLabels", "commonLabels", "externalURL", "groupKey"} <= payload.keys()
    alert = payload["alerts"][0]
    assert alert["labels"]["job_id"] == "job-7" and alert["labels"]["category"] == "nccl_timeout"
    assert alert["annotations"]["event_id"] == event.id and alert["fingerprint"]
    assert alert["startsAt"] == event.time and alert["endsAt"].startswith("0001-")


async def test_a_failing_receiver_dead_letters_with_the_reason_and_the_next_event_goes(
    nats_url: str, redis_url: str, bus: Bus
) -> None:
    receiver = Receiver(status=500)
    with serve_api(nats_url, redis_url, webhook_max_attempts=3, webhook_retry_base_s=0.01) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            hook = (await client.post("/v1/webhooks", json={"url": receiver.url})).json()
            path = f"/v1/webhooks/{hook['id']}"

            async def dead_letters(count: int) -> list[dict[str, object]]:
                status = (await client.get(path)).json()["status"]
                letters: list[dict[str, object]] = status["recent_dead_letters"]
                return letters if status["dead_letters"] >= count else []

            first = await bus.publish_event(submitted("job-1"))
            letter = (await eventually(lambda: dead_letters(1), timeout_s=20))[0]
            assert letter["event_id"] == first.id and letter["attempts"] == 3
            assert "500" in str(letter["reason"]) and "gave up after 3" in str(letter["reason"])

            receiver.status = 404  # refused: dead-lettered at the first answer
            second = await bus.publish_event(submitted("job-2"))
            letter = (await eventually(lambda: dead_letters(2), timeout_s=20))[0]
            assert letter["event_id"] == second.id and letter["attempts"] == 1
            assert "refused" in str(letter["reason"])

            receiver.status = 200
            third = await bus.publish_event(submitted("job-3"))
            assert await received(receiver, 1) == [third.id]
            status = (await client.get(path)).json()["status"]
            assert status["delivered"] == 1 and status["consecutive_failures"] == 0
    receiver.down()


async def test_a_refused_event_is_dead_lettered_onto_the_stream_and_counted(
    client: httpx.AsyncClient, bus: Bus
) -> None:
    receiver = Receiver(status=400)
    try:
        hook = (await client.post("/v1/webhooks", json={"url": receiver.url})).json()
        event = await bus.publish_event(submitted("job-1"))

        async def letter_on_stream() -> DeadLetter | None:
            async for _, raw in bus.read_stream(DEADLETTER_STREAM, [DEADLETTER_SUBJECT]):
                letter = DeadLetter.model_validate_json(raw)
                if hook["id"] in letter.payload:
                    return letter
            return None

        letter = await eventually(letter_on_stream, timeout_s=20)
    finally:
        receiver.down()
    kept = WebhookDeadLetter.model_validate_json(letter.payload)
    assert (kept.webhook_id, kept.event_id, kept.attempts) == (hook["id"], event.id, 1)
    assert "refused" in kept.reason and "400" in kept.reason
    assert hook["id"] in letter.reason and "400" in letter.reason
    assert letter.service == "unicron/api" and letter.subject == event.nats_subject
    metrics = (await client.get("/metrics")).text
    assert 'unicron_dead_letters_total{service="api"} 1.0' in metrics


async def test_a_deleted_webhook_gets_nothing_more_and_loses_its_consumer(
    client: httpx.AsyncClient, bus: Bus, receiver: Receiver
) -> None:
    witness = Receiver()
    try:
        gone = (await client.post("/v1/webhooks", json={"url": receiver.url})).json()
        await client.post("/v1/webhooks", json={"url": witness.url})
        first = await bus.publish_event(submitted("job-1"))
        assert await received(receiver, 1) == [first.id]

        assert (await client.delete(f"/v1/webhooks/{gone['id']}")).status_code == 204
        with pytest.raises(NotFoundError):
            await bus.js.consumer_info(EVENTS_STREAM, consumer_name(gone["id"]))
        second = await bus.publish_event(submitted("job-2"))
        assert await received(witness, 2) == [first.id, second.id]
        assert receiver.event_ids() == [first.id]
    finally:
        witness.down()


async def test_a_restarted_api_delivers_what_came_while_it_was_down(
    nats_url: str, redis_url: str, bus: Bus, receiver: Receiver
) -> None:
    with serve_api(nats_url, redis_url) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            made = await client.post("/v1/webhooks", json={"url": receiver.url})
            assert made.status_code == 201
    missed = await bus.publish_event(submitted("job-1"))  # no API runs now
    with serve_api(nats_url, redis_url):  # its webhooks come back from Redis
        assert await received(receiver, 1) == [missed.id]
