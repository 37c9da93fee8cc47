"""The NATS JetStream bus: streams, publishing with de-duplication, durable consumers.

Consumers are push-based durable queue subscriptions, so a restarted service resumes where its
durable left off and several instances of one service share the work. A message is acked only
after its handler returned; one that cannot be parsed, or whose handler keeps failing, is
published to ``unicron.deadletter`` and terminated — the service never crashes on bad input
(:mod:`unicron.shared.bus.delivery`).

With a NATS cluster (``UNICRON_NATS_URL`` naming several servers) the client fails over to
another server by itself, and the streams keep every message on ``UNICRON_STREAM_REPLICAS``
servers: a publish is acknowledged once a majority of them stored it, so losing one server of
three loses nothing acknowledged (docs/design.md §6). The durable consumers inherit the count.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from unicron.shared.bus.api import EventBus, Outgoing
from unicron.shared.bus.checkpoints import CheckpointObjects
from unicron.shared.bus.delivery import PARSE_ERRORS, Delivery, consumer_config
from unicron.shared.bus.lane import lane_subject
from unicron.shared.bus.natslogin import NatsAccess, open_client
from unicron.shared.bus.packages import get_package, has_package, put_package
from unicron.shared.bus.publisher import Publisher
from unicron.shared.bus.streams import ALL_EVENTS, EVENTS_STREAM, STREAMS
from unicron.shared.bus.streamsetup import NOT_READY, ensure_streams
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.logging import get_logger
from unicron.shared.metrics import ServiceMetrics
from unicron.shared.outage import Outage

__all__ = ["STREAMS", "Bus", "parse_event"]
log = get_logger(component="bus")
READ_TIMEOUT_S = 5.0  # the longest wait for the next stored message of a stream read whole


def parse_event(raw: bytes) -> CloudEvent:
    """Parse an envelope and check its data against the event's model."""
    event = CloudEvent.model_validate_json(raw)
    event.typed()
    return event


class Bus(EventBus):
    def __init__(
        self,
        nc: NatsClient,
        js: JetStreamContext,
        source: str,
        replicas: int | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        super().__init__(source, metrics)
        self.nc = nc
        self.js = js
        # On how many servers the streams this bus creates live; None: 1, or as they are.
        self.replicas = replicas
        self._subs: list[Any] = []
        self._deliveries: list[Delivery[Any]] = []
        self.publisher = Publisher(nc, js)
        self.link_outage = Outage("nats connection", component="bus", source=source)

    @classmethod
    async def connect(
        cls,
        url: str,
        source: str,
        connect_timeout_s: float = 30.0,
        access: NatsAccess | None = None,
        replicas: int | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> Bus:
        """Log in as ``access`` (anonymous without) to any server of ``url`` (one, or several
        comma-separated) and make sure the streams exist.

        Raises :class:`CredentialsError` at once when the server refuses the login, and
        ``TimeoutError`` when it is not reached within ``connect_timeout_s``. Only a role that
        manages streams creates them, on ``replicas`` servers (None: existing streams keep
        theirs, :mod:`unicron.shared.bus.streamsetup`); another waits for them (docs/design.md
        §11). The bus reads no settings: a service passes ``CommonSettings.replicas_asked``
        (:mod:`unicron.shared.service`). A term's connection passes its service's ``metrics``.
        """
        access = access or NatsAccess()
        # nats-py's default logs a traceback per reconnect attempt while the server is away.
        link = Outage("nats connection", component="bus", source=source)
        nc = await open_client(url, source, connect_timeout_s, access, link)
        bus = cls(nc, nc.jetstream(), source, replicas, metrics)
        bus.link_outage = link
        if access.manages_streams:
            await bus._ensure_streams_within(connect_timeout_s)
        else:
            await bus.await_streams(connect_timeout_s)
        return bus

    async def _ensure_streams_within(self, timeout_s: float) -> None:
        """:meth:`ensure_streams`, retried while JetStream is not ready: a cluster just started
        (or one that lost its leader) answers nothing until its servers elected one."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await self.ensure_streams()
                self.link_outage.ok()
                return
            except NOT_READY as exc:
                if time.monotonic() >= deadline:
                    await self.close()
                    raise TimeoutError(f"JetStream not ready in {timeout_s:g}s: {exc}") from exc
                self.link_outage.failed(exc)
            await self.link_outage.pause()

    @property
    def connected(self) -> bool:
        """Whether the client is connected now (not while it reconnects)."""
        return self.nc.is_connected

    async def ensure_streams(self) -> None:
        """Create the streams and the packages' bucket on this bus's replica count, or bring
        existing ones to it (:mod:`unicron.shared.bus.streamsetup`)."""
        await ensure_streams(self.js, self.replicas)

    async def await_streams(self, timeout_s: float) -> None:
        """Wait until the stream manager (the API) has created every stream. A cluster still
        electing its JetStream leader answers with errors, not "not found": waited out too."""
        deadline = time.monotonic() + timeout_s
        missing, told = list(STREAMS), False
        while True:
            try:
                found = await asyncio.gather(*(self._has_stream(name) for name in missing))
                missing = [name for name, ok in zip(missing, found, strict=True) if not ok]
                self.link_outage.ok()
            except NOT_READY as exc:
                self.link_outage.failed(exc)
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"streams {missing} not created in {timeout_s:g}s")
            if not told:  # once, not once per attempt
                log.info("waiting for the api to create the streams", missing=missing)
                told = True
            await asyncio.sleep(0.5)

    async def _has_stream(self, name: str) -> bool:
        try:
            await self.js.stream_info(name)
        except NotFoundError:
            return False
        return True

    async def close(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):  # the connection may already be gone
                await sub.unsubscribe()
        for delivery in self._deliveries:  # what they held unacked, the server redelivers
            await delivery.stop()
        if not self.nc.is_closed:
            with contextlib.suppress(Exception):  # e.g. a drain timeout: close regardless
                await self.nc.drain()
        # A drain that timed out leaves the client open, and with unlimited reconnects it would
        # try a vanished server forever: the shutdown (or the test's event loop) never ends.
        if not self.nc.is_closed:
            await self.nc.close()

    # --- publishing ----------------------------------------------------------------------

    async def _publish(self, subject: str, payload: bytes, msg_id: str | None = None) -> None:
        await self.publisher.publish(subject, payload, msg_id)

    async def lane_ahead(self, messages: Sequence[Outgoing]) -> None:
        await self.publisher.lane_ahead(messages)

    # --- request/reply and objects -------------------------------------------------------

    async def serve(self, subject: str, answer: Callable[[bytes], Awaitable[bytes]]) -> None:
        """Answer each core-NATS request on ``subject`` with what ``answer`` makes of its
        payload. Nothing is stored: a request nobody is there to answer times out."""

        async def respond(msg: Msg) -> None:
            reply = await answer(msg.data)
            if msg.reply:  # a plain publish to the subject expects no answer
                await msg.respond(reply)

        await self.nc.subscribe(subject, cb=respond)

    async def request(self, subject: str, payload: bytes, timeout_s: float) -> bytes:
        return (await self.nc.request(subject, payload, timeout=timeout_s)).data

    async def package(self, sha256: str) -> bytes:
        """A job package's bytes from the packages' object store
        (:mod:`unicron.shared.bus.packages`)."""
        return await get_package(self.js, sha256)

    def checkpoint_objects(self) -> CheckpointObjects:
        """Scripts' checkpoint snapshots (:mod:`unicron.shared.bus.checkpoints`)."""
        return CheckpointObjects(self.js)

    async def has_package(self, sha256: str) -> bool:
        return await has_package(self.js, sha256)

    async def put_package(self, data: bytes) -> tuple[str, bool]:
        return await put_package(self.js, data)

    # --- stored messages -----------------------------------------------------------------

    async def last_event_seq(self) -> int:
        info = await self.js.stream_info(EVENTS_STREAM)
        return int(info.state.last_seq)

    async def read_stream(
        self, stream: str, subjects: list[str]
    ) -> AsyncIterator[tuple[str, bytes]]:
        infos = [await self.js.stream_info(stream, subjects_filter=s) for s in subjects]
        if sum(sum((i.state.subjects or {}).values()) for i in infos) == 0:
            return
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, filter_subjects=subjects)
        sub = await self.js.subscribe(
            subjects[0], stream=stream, ordered_consumer=True, config=config
        )
        try:
            while True:
                msg = await sub.next_msg(timeout=READ_TIMEOUT_S)
                yield msg.subject, msg.data
                if msg.metadata is None or msg.metadata.num_pending == 0:
                    return
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def last_message(self, stream: str, subject: str) -> bytes | None:
        try:
            msg = await self.js.get_last_msg(stream, subject)
        except NotFoundError:
            return None
        return msg.data or b""

    # --- consuming -----------------------------------------------------------------------

    async def _bind(
        self, subject: str, durable: str, deliver_new: bool, delivery: Delivery[Any]
    ) -> None:
        # While a stream or consumer elects a new leader (a server of the cluster died), the
        # consumer's info and create requests time out for seconds: a service (re)started
        # then waits them out instead of exiting.
        outage = Outage("consumer bind", component="bus", durable=durable)
        # Named: nats-py then creates it by CONSUMER.CREATE.<stream>.<name>.<filter>, whose
        # filter the server checks against the user's grant (docs/design.md §11).
        config = consumer_config(durable, deliver_new)
        subscribe = functools.partial(
            self.js.subscribe, subject, queue=durable, durable=durable, cb=delivery.receive,
            manual_ack=True, config=config,
        )  # fmt: skip
        sub = await outage.through(subscribe)
        lane = await self.nc.subscribe(lane_subject(subject), queue=durable, cb=delivery.by_lane)
        delivery.start()
        self._subs += [sub, lane]
        self._deliveries.append(delivery)

    async def tail_events(
        self, after_seq: int | None = None
    ) -> AsyncGenerator[tuple[int, CloudEvent], None]:
        if after_seq is None:
            config = ConsumerConfig(deliver_policy=DeliverPolicy.NEW)
        else:
            config = ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after_seq + 1
            )
        sub = await self.js.subscribe(ALL_EVENTS, ordered_consumer=True, config=config)
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=3600)
                except nats.errors.TimeoutError:
                    continue
                seq = msg.metadata.sequence.stream if msg.metadata else 0
                try:
                    yield seq, parse_event(msg.data)
                except PARSE_ERRORS:
                    log.warning("skipping malformed event", seq=seq)
        finally:
            await sub.unsubscribe()
