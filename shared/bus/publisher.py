"""Publishing a message: its copy on the fast lane at once, then its record in the stream,
stored through a leader election.

The lane's copy goes first (:mod:`unicron.shared.bus.lane`) and at most once per id, so a
burst of commands sent ahead with :meth:`Publisher.lane_ahead` is not sent twice. Storing
waits out a stream's leader election in place, the message's id making a repeat a no-op: a
handler whose publish failed would be run again from its start, after its first attempt had
acted on the lane's copy and written its state, and find nothing left to do but the messages
it never stored.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from unicron.shared.bus.api import Outgoing
from unicron.shared.bus.lane import MSG_ID, Handled, lane_subject
from unicron.shared.outage import Outage, is_outage

# How long a publish retries storing its message: past a leader election (4-9 s measured on
# nats-server 2.15, bench/natsleader.py), short of hiding a cluster that is really gone.
STORE_RETRY_S = 15.0
# Not connected: a client moving to another server takes milliseconds; one with no server to
# go to raises soon, and its caller says the bus is away.
RECONNECT_RETRY_S = 2.0
STORE_TIMEOUT_S = 5.0  # one attempt's wait for JetStream's acknowledgement


class Publisher:
    def __init__(self, nc: NatsClient, js: JetStreamContext) -> None:
        self.nc = nc
        self.js = js
        self._laned = Handled()  # ids whose lane copy was sent already

    async def publish(self, subject: str, payload: bytes, msg_id: str | None) -> None:
        if msg_id is None:
            await self.store(subject, payload, None)
            return
        await self.lane(subject, payload, msg_id)
        await self.store(subject, payload, {MSG_ID: msg_id})

    async def lane(self, subject: str, payload: bytes, msg_id: str) -> None:
        """Send a message's lane copy, once: fire and forget."""
        if msg_id in self._laned:
            return
        self._laned.add(msg_id)
        with contextlib.suppress(Exception):
            await self.nc.publish(lane_subject(subject), payload, headers={MSG_ID: msg_id})

    async def lane_ahead(self, messages: Sequence[Outgoing]) -> None:
        for message in messages:
            if message.msg_id is not None:
                await self.lane(message.subject, message.payload, message.msg_id)

    async def store(self, subject: str, payload: bytes, headers: dict[str, str] | None) -> None:
        started = time.monotonic()
        outage = Outage("stream publish", component="bus", subject=subject)
        while True:
            try:
                await self.js.publish(subject, payload, headers=headers, timeout=STORE_TIMEOUT_S)
                break
            except Exception as exc:
                limit = STORE_RETRY_S if self.nc.is_connected else RECONNECT_RETRY_S
                if not is_outage(exc) or time.monotonic() - started >= limit:
                    raise
                outage.failed(exc)
            await outage.pause()
        if outage.down:
            outage.ok()
