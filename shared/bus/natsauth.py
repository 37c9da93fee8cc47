"""Who may say what on the bus: one NATS user per service and per agent, with the subjects
each may publish and subscribe, enforced by nats-server (docs/design.md §11).

This module is the one place that knows the permission table. ``unicron up`` renders it into
its embedded server's configuration (:func:`render_server_config`), ``deploy/make_secrets.py``
into the files a deployment mounts as secrets; clients log in through shared/bus/natslogin.py. A
client's replies and push-consumer deliveries arrive under its own inbox prefix,
``_INBOX.<user>``, so no user can read another's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from unicron.shared.bus.checkpoints import CHECKPOINTS_BUCKET
from unicron.shared.bus.lane import lane_subject
from unicron.shared.bus.packages import PACKAGES_BUCKET
from unicron.shared.bus.streams import COMMANDS_STREAM as COMMANDS
from unicron.shared.bus.streams import EVENTS_STREAM as EVENTS
from unicron.shared.bus.streams import REPORTS_STREAM as REPORTS
from unicron.shared.bus.streams import STREAMS
from unicron.shared.contracts import events as ev
from unicron.shared.contracts.logs import logs_subject
from unicron.shared.contracts.messages import (
    COMMAND_SUBJECT_PREFIX,
    DEADLETTER_SUBJECT,
    command_subject,
    ping_subject,
)
from unicron.shared.contracts.reports import REPORT_SUBJECT_PREFIX
from unicron.shared.contracts.roles import ServiceRole, ServiceUser, agent_user
from unicron.shared.contracts.webhooks import WEBHOOKS_CHANGED_SUBJECT

# The stream behind the packages' object store.
PACKAGES = f"OBJ_{PACKAGES_BUCKET}"
CHECKPOINTS = f"OBJ_{CHECKPOINTS_BUCKET}"


def inbox_prefix(user: str) -> str:
    return f"_INBOX.{user}"


# --- the permission table -----------------------------------------------------------------


class Permissions(BaseModel):
    """What one user may publish and subscribe; a subject not allowed is refused."""

    publish: list[str]
    subscribe: list[str]
    allow_responses: bool = False  # may answer the requests it receives (ping, logs)


def _events(*kinds: type[ev.EventData]) -> list[str]:
    return [ev.event_subject(kind.TYPE) for kind in kinds]


def _reads(stream: str) -> list[str]:
    """Consuming ``stream``: consumers of any name on it, their acks and flow control, and
    single-message reads; never creating, changing or deleting the stream itself."""
    api = "$JS.API"
    return [
        f"{api}.CONSUMER.CREATE.{stream}", f"{api}.CONSUMER.CREATE.{stream}.>",
        f"{api}.CONSUMER.DURABLE.CREATE.{stream}.>", f"{api}.CONSUMER.INFO.{stream}.>",
        f"{api}.STREAM.MSG.GET.{stream}", f"{api}.DIRECT.GET.{stream}",
        f"{api}.DIRECT.GET.{stream}.>", f"$JS.ACK.{stream}.>", f"$JS.FC.{stream}.>",
    ]  # fmt: skip


def _own_command_consumer(node_id: str) -> list[str]:
    """An agent's one durable consumer, on its own command subject only: Bus.consume names its
    consumers, so nats-py creates them in the filtered CREATE form, which lets the server check
    the filter (the unfiltered DURABLE.CREATE is never granted to an agent)."""
    durable, api = agent_user(node_id), "$JS.API"
    return [
        f"{api}.CONSUMER.CREATE.{COMMANDS}.{durable}.{command_subject(node_id)}",
        f"{api}.CONSUMER.INFO.{COMMANDS}.{durable}",
        f"$JS.ACK.{COMMANDS}.{durable}.>",
    ]


# Read-only JetStream API every user needs to find streams.
# JetStream's account info: every login may ask it, so it is the agent's round trip (fence.py)
JETSTREAM_INFO = "$JS.API.INFO"
_LOOKUP = [JETSTREAM_INFO, "$JS.API.STREAM.NAMES", "$JS.API.STREAM.INFO.*"]
_ALL_COMMANDS = COMMAND_SUBJECT_PREFIX + ">"  # every agent's, not the whole stream's


def _publishes(user: ServiceUser) -> list[str]:
    role = user.role
    if role == ServiceRole.API:  # the stream manager; its admin fault path sends commands
        # It acks the events its webhooks' consumers delivered (services/api/webhook_delivery.py).
        return [
            *_events(ev.JobSubmitted, ev.JobStateChanged), _ALL_COMMANDS, logs_subject("*"),
            "$JS.API.>", f"$O.{PACKAGES_BUCKET}.>", f"$JS.FC.{EVENTS}.>", f"$JS.FC.{PACKAGES}.>",
            f"$JS.ACK.{EVENTS}.>", WEBHOOKS_CHANGED_SUBJECT,
        ]  # fmt: skip
    if role == ServiceRole.DETECTOR:
        failures = _events(ev.FailureDetected, ev.JobStateChanged, ev.NodeLost, ev.NodeStateChanged)
        return [*failures, ping_subject("*"), *_reads(REPORTS)]
    if role == ServiceRole.PLANNER:
        return [*_events(ev.PlanCreated), *_reads(EVENTS), *_reads(REPORTS)]
    if role == ServiceRole.EXECUTOR:
        transitions = _events(ev.JobStateChanged, ev.TransitionStarted, ev.TransitionCompleted)
        return [*transitions, _ALL_COMMANDS, *_reads(EVENTS), *_reads(REPORTS)]
    assert user.node_id is not None, "an agent user names its node"
    own_reports = f"{REPORT_SUBJECT_PREFIX}{user.node_id}.>"
    packages = _reads(PACKAGES)  # fetching a job's working dir; writing is the API's
    # scripts' checkpoint snapshots: written and read by agents alone (services/agent/mirror.py);
    # a put replaces an object's chunks by purging them
    snapshots = [
        *_reads(CHECKPOINTS), f"$O.{CHECKPOINTS_BUCKET}.>", f"$JS.API.STREAM.PURGE.{CHECKPOINTS}",
    ]  # fmt: skip
    own = [own_reports, *_events(ev.NodeJoined), *_own_command_consumer(user.node_id)]
    return [*own, *packages, *snapshots]


# The subjects of the streams whose messages may also travel the fast lane: every one with an
# id (events, commands, reports); a dead letter has none.
_STREAM_PREFIXES = tuple(
    s.removesuffix(">") for subjects in STREAMS.values() for s in subjects if s.endswith(">")
)


def _lanes(user: ServiceUser, publish: list[str]) -> tuple[list[str], list[str]]:
    """The fast lane (shared/bus/lane.py) granted as the streams are: a user publishes the
    lane twin of each stream subject it may publish, and reads the lanes of the streams it
    may create consumers on (an agent: of its own command subject)."""
    sends = [lane_subject(g) for g in publish if g.startswith(_STREAM_PREFIXES)]
    reads = [
        lane_subject(subject)
        for stream, subjects in STREAMS.items()
        if f"$JS.API.CONSUMER.CREATE.{stream}" in publish
        for subject in subjects
    ]
    if user.node_id is not None:
        reads.append(lane_subject(command_subject(user.node_id)))
    return sends, reads


def permissions(user: ServiceUser) -> Permissions:
    if user.role == ServiceRole.ADMIN:
        return Permissions(publish=[">"], subscribe=[">"])
    inbox = inbox_prefix(user.name) + ".>"
    publish = [*_publishes(user), DEADLETTER_SUBJECT, *_LOOKUP]
    sends, reads = _lanes(user, publish)
    publish += sends
    if user.role == ServiceRole.API:  # its replicas tell each other of webhooks added, deleted
        reads.append(WEBHOOKS_CHANGED_SUBJECT)
    if user.role != ServiceRole.AGENT:
        return Permissions(publish=publish, subscribe=[inbox, *reads])
    assert user.node_id is not None
    requests = [ping_subject(user.node_id), logs_subject(user.node_id)]
    subscribe = [inbox, *requests, *reads]
    return Permissions(publish=publish, subscribe=subscribe, allow_responses=True)


# --- the server's configuration -----------------------------------------------------------


class NatsTls(BaseModel):
    """The certificate and key a NATS server serves TLS with (clients then use tls://)."""

    cert: Path
    key: Path


def _conf_user(user: ServiceUser, password: str) -> dict[str, Any]:
    grant = permissions(user)
    rules: dict[str, Any] = {
        "publish": {"allow": grant.publish},
        "subscribe": {"allow": grant.subscribe},
    }
    if grant.allow_responses:
        rules["allow_responses"] = True
    return {"user": user.name, "password": password, "permissions": rules}


def render_server_config(
    logins: Iterable[tuple[ServiceUser, str]],
    listen: str,
    store_dir: Path | str,
    tls: NatsTls | None = None,
) -> str:
    """A nats-server configuration: JetStream, and only these (user, password) logins.

    JSON is valid nats-server configuration syntax, and its quoting keeps every ``$`` of a
    subject literal (unquoted, nats-server would read ``$JS`` as a variable).
    """
    config: dict[str, Any] = {
        "listen": listen,
        "jetstream": {"store_dir": str(store_dir)},
        "authorization": {"users": [_conf_user(user, pw) for user, pw in logins]},
    }
    if tls is not None:
        config["tls"] = {"cert_file": str(tls.cert), "key_file": str(tls.key)}
    return json.dumps(config, indent=2) + "\n"
