"""One JetStream message through a consumer: parse, check its claims, handle, ack.

What each outcome means: a message that does not parse, or whose claims the state contradicts,
is dead-lettered and terminated at once; one whose handler fails is handed back a few times,
then dead-lettered; while Redis or NATS is away the handler is retried in place, so the outage
spends none of the message's deliveries. A message is acked only after its handler returned.

Redelivery is soon for the first time and slower after: when a service is killed mid-message
(or with messages delivered but not yet handled), its restarted consumer gets them back about a
second later instead of after a long ack wait — a detector killed during a fault must not delay
that fault's detection by half a minute. A handler that runs longer keeps its message with
``in_progress`` so it is not redelivered meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from unicron.shared.logging import get_logger
from unicron.shared.outage import Outage, is_outage

T = TypeVar("T")
log = get_logger(component="bus")

MAX_DELIVER = 5
# Seconds before each redelivery of an unacked message (the first doubles as the ack wait).
REDELIVERY_S = (1.0, 5.0, 15.0, 30.0, 30.0)
KEEP_ALIVE_S = REDELIVERY_S[0] / 3
# Holding a message through an outage stops here: it is handed back to the server then.
OUTAGE_HOLD_S = 90.0
# What a parser raises for a message it cannot take: that message is dead-lettered, not retried.
PARSE_ERRORS = (ValidationError, ValueError, KeyError)


class ClaimRefusedError(Exception):
    """A well-formed message whose claims the state contradicts (a report about a worker its
    node does not run, a drill the API never marked): dead-lettered at once, never retried,
    because nothing on the bus is trusted just because it arrived (docs/design.md §6)."""


Claim = Callable[[str, T], Awaitable[None]]
DeadLetterSink = Callable[[str, bytes, str, int], Awaitable[None]]


def consumer_config(durable: str, deliver_new: bool) -> ConsumerConfig:
    policy = DeliverPolicy.NEW if deliver_new else DeliverPolicy.ALL
    return ConsumerConfig(
        name=durable,
        ack_wait=REDELIVERY_S[0],
        backoff=list(REDELIVERY_S),
        max_deliver=MAX_DELIVER + 1,
        deliver_policy=policy,
    )


@dataclass
class Delivery(Generic[T]):
    """Takes each message of one consumer to ``handler`` (see the module doc)."""

    parse: Callable[[bytes], T]
    handler: Callable[[T], Awaitable[None]]
    claim: Claim[T] | None
    dead_letter: DeadLetterSink
    outage: Outage
    refused: Callable[[], None]

    async def on_message(self, msg: Msg) -> None:
        deliveries = msg.metadata.num_delivered if msg.metadata else 1
        try:
            item = self.parse(msg.data)
        except PARSE_ERRORS as exc:
            await self._reject(msg, f"invalid message: {exc}", deliveries)
            return
        keeper = asyncio.create_task(_keep_alive(msg))
        try:
            await self._handle_through_outage(msg, item)
        except ClaimRefusedError as exc:
            self.refused()
            await self._reject(msg, f"refused: {exc}", deliveries)
            return
        except Exception as exc:
            await self._failed(msg, exc, deliveries)
            return
        finally:
            keeper.cancel()
        self.outage.ok()
        await msg.ack()

    async def _reject(self, msg: Msg, reason: str, deliveries: int) -> None:
        await self.dead_letter(msg.subject, msg.data, reason, deliveries)
        await msg.term()

    async def _failed(self, msg: Msg, exc: Exception, deliveries: int) -> None:
        if is_outage(exc):  # still away: hand it back for later, without a traceback
            with contextlib.suppress(Exception):
                await msg.nak(delay=self.outage.delay())
        elif deliveries >= MAX_DELIVER:
            await self._reject(msg, f"handler failed: {exc!r}", deliveries)
        else:
            log.exception("handler failed; will retry", subject=msg.subject)
            await msg.nak(delay=0.5 * deliveries)

    async def _handle_through_outage(self, msg: Msg, item: T) -> None:
        """Run the claim check and the handler, retrying in place while Redis or NATS is away:
        redeliveries would spend the message's few deliveries on an outage that is not its
        fault, and holding it keeps its order too."""
        deadline = time.monotonic() + OUTAGE_HOLD_S
        while True:
            try:
                if self.claim is not None:
                    await self.claim(msg.subject, item)
                await self.handler(item)
                return
            except Exception as exc:
                if not is_outage(exc) or time.monotonic() >= deadline:
                    raise
                self.outage.failed(exc)
            await self.outage.pause()


async def _keep_alive(msg: Msg) -> None:
    """Tell the server the message is still being handled, so it is not redelivered."""
    while True:
        await asyncio.sleep(KEEP_ALIVE_S)
        with contextlib.suppress(Exception):  # NATS may be the one that is away
            await msg.in_progress()
