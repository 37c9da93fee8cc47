"""Creating the JetStream streams and the object stores (packages, scripts' checkpoints), on
as many servers as configured.

``UNICRON_STREAM_REPLICAS`` says on how many servers each stream keeps its messages; 3 in a
3-server cluster. When it is set, existing streams with another count are changed to it, with a
warning (JetStream copies or drops the replicas online). When it is not, new streams get one
replica and existing ones keep theirs: an operator's tool with a bare environment must not
shrink a cluster's streams to one server. A count the cluster cannot give (more than its
servers, or above 1 on a single server) is :class:`StreamReplicasError`, which names the
setting to fix.

The events stream's limits (how long and how much it keeps, ``UNICRON_EVENTS_MAX_*``) are set
by the API at each start (:func:`apply_limits`); bringing a stream to its replica count keeps
whatever limits it has, so a service that starts with other settings never resets them.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StreamConfig
from nats.js.errors import APIError, BadRequestError, BucketNotFoundError
from unicron.shared.bus.checkpoints import CHECKPOINTS_BUCKET, checkpoints_config
from unicron.shared.bus.packages import PACKAGES_BUCKET
from unicron.shared.bus.streams import (
    COMMANDS_MAX_CONSUMERS,
    COMMANDS_STREAM,
    REPORTS_MAX_AGE_S,
    REPORTS_STREAM,
    STREAMS,
)
from unicron.shared.logging import get_logger
from unicron.shared.outage import BUS_ERRORS

log = get_logger(component="bus")
# JetStream's err_code for "replicas > 1 not supported in non-clustered mode", "insufficient
# resources" and "no suitable peers for placement": fewer servers than replicas.
REPLICA_REFUSALS = (10074, 10023, 10005)
# JetStream's default de-duplication window: a message id seen this recently is dropped.
DUPLICATE_WINDOW_S = 120.0
# What JetStream answers until its servers elected a leader (a 503 among them).
NOT_READY = BUS_ERRORS


class StreamReplicasError(RuntimeError):
    """JetStream cannot keep the streams on as many servers as ``UNICRON_STREAM_REPLICAS``."""


async def ensure_streams(js: JetStreamContext, replicas: int | None) -> None:
    """Create the streams and the buckets, or bring existing ones to ``replicas``
    (a single server's streams, now in a cluster, are scaled up); None: one replica for a new
    stream, an existing one keeps its count."""
    try:
        for name, subjects in STREAMS.items():
            max_age = REPORTS_MAX_AGE_S if name == REPORTS_STREAM else None
            consumers = COMMANDS_MAX_CONSUMERS if name == COMMANDS_STREAM else None
            config = StreamConfig(
                name=name, subjects=subjects, max_age=max_age, num_replicas=replicas or 1,
                max_consumers=consumers,
            )  # fmt: skip
            try:
                await js.add_stream(config)
            except BadRequestError as exc:  # it exists, with another configuration
                if exc.err_code in REPLICA_REFUSALS:
                    raise
                current = (await js.stream_info(name)).config
                config.num_replicas = await _replicas_for(js, name, replicas)
                _keep_limits(config, current)
                await js.update_stream(config)
        buckets = {
            PACKAGES_BUCKET: ObjectStoreConfig(replicas=replicas or 1),
            CHECKPOINTS_BUCKET: checkpoints_config(replicas or 1),
        }
        for bucket, bucket_config in buckets.items():
            await _ensure_bucket(js, bucket, bucket_config, replicas)
    except APIError as exc:
        if exc.err_code not in REPLICA_REFUSALS:
            raise
        raise StreamReplicasError(
            f"JetStream cannot keep the streams on {replicas} servers ({exc.description}): "
            "UNICRON_STREAM_REPLICAS must not exceed the NATS servers in the cluster "
            "(1 for a single server)"
        ) from exc


@dataclass(frozen=True)
class StreamLimits:
    """How long and how many bytes a stream keeps its messages; 0: no limit."""

    max_age_s: float
    max_bytes: int


def _keep_limits(config: StreamConfig, current: StreamConfig) -> None:
    """The limits ``config`` leaves unset are ``current``'s, not the server's defaults."""
    for limit in ("max_age", "max_bytes", "max_msgs"):
        if getattr(config, limit) is None:
            setattr(config, limit, getattr(current, limit))


async def apply_limits(js: JetStreamContext, stream: str, limits: StreamLimits) -> None:
    """Bring ``stream`` to ``limits``; messages past the new ones are dropped by the server."""
    config = (await js.stream_info(stream)).config
    max_age, max_bytes = limits.max_age_s, limits.max_bytes or -1  # -1: the server's no-limit
    if (config.max_age or 0.0, config.max_bytes or -1) == (max_age, max_bytes):
        return
    log.info("stream limits change", stream=stream, max_age_s=max_age, max_bytes=max_bytes,
             max_age_s_before=config.max_age, max_bytes_before=config.max_bytes)  # fmt: skip
    config.max_age, config.max_bytes = max_age, max_bytes
    # The server refuses a de-duplication window longer than the age limit.
    config.duplicate_window = min(DUPLICATE_WINDOW_S, max_age or DUPLICATE_WINDOW_S)
    await js.update_stream(config)


async def _ensure_bucket(
    js: JetStreamContext, bucket: str, config: ObjectStoreConfig, replicas: int | None
) -> None:
    try:
        await js.object_store(bucket)
    except BucketNotFoundError:
        await js.create_object_store(bucket, config=config)
        return
    stream = f"OBJ_{bucket}"
    current = (await js.stream_info(stream)).config
    wanted = await _replicas_for(js, stream, replicas)
    if (current.num_replicas or 1) != wanted:
        current.num_replicas = wanted
        await js.update_stream(current)


async def _replicas_for(js: JetStreamContext, stream: str, replicas: int | None) -> int:
    """The count an existing ``stream`` is to have: ``replicas``, or its own when None."""
    old = (await js.stream_info(stream)).config.num_replicas or 1
    if replicas is None:
        return old
    if old != replicas:
        log.warning("stream moves to another replica count", stream=stream,
                    replicas_before=old, replicas=replicas)  # fmt: skip
    return replicas
