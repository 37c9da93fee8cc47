"""The fast lane: every stored message also goes out once over core NATS, so a recovery does
not wait for JetStream's leader elections.

A kill -9 of one NATS server of three stalls JetStream wherever that server led: measured on
nats-server 2.15 (``bench/natsleader.py``), publishing to a stream whose leader died waits
~4.5 s for the election, and a durable consumer whose leader died delivers nothing for
~6.4 s. Core NATS has no leader: a client whose server died is on another within
milliseconds. So :class:`unicron.shared.bus.bus.Bus` publishes each message that has an id
(every event, command and report) to ``lane.<its subject>`` just before storing it, and each
durable consumer also subscribes to the lane of its subject, in a queue group of the
consumer's name. The consumer's delivery takes whichever copy comes first and skips the other
by the message's id (:class:`unicron.shared.bus.delivery.Delivery`).

The stream stays the record: a lane copy is not acknowledged, retried or dead-lettered, and one
that is lost (nobody subscribed yet, a reconnect) or whose handler failed is simply handled
again from the stream. Order falls back to the stream's then: once a lane copy was not handled,
later lane copies are passed over until the stream copy of that one is settled (a
:class:`LaneGap`), or a rank's exit could overtake its last step and a finished job keep the
step before it. The lane is granted per user exactly as the stream subjects are
(:mod:`unicron.shared.bus.natsauth`), so it carries nobody's messages but the sender's own.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.msg import Msg

LANE_PREFIX = "lane."
MSG_ID = "Nats-Msg-Id"
REMEMBERED = 16_384  # ids a delivery keeps of messages it handled, oldest forgotten first
# How long a gap may hold the lane shut: past the stream copy's redeliveries and dead letter.
LANE_GAP_S = 30.0


def lane_subject(subject: str) -> str:
    return LANE_PREFIX + subject


def lane_subjects(subjects: list[str]) -> list[str]:
    return [lane_subject(s) for s in subjects]


@dataclass
class LaneMsg:
    """A message's copy from the lane: what a delivery reads of a JetStream message, with
    nothing to acknowledge."""

    subject: str  # the stream subject it was published for (the lane's prefix removed)
    data: bytes
    headers: dict[str, str] | None
    lane = True
    metadata = None

    @classmethod
    def of(cls, msg: Msg) -> LaneMsg:
        return cls(msg.subject.removeprefix(LANE_PREFIX), msg.data, msg.headers)

    async def ack(self) -> None:
        """A lane copy is not stored: there is nothing to acknowledge."""

    async def term(self) -> None:
        """Nor to terminate."""

    async def nak(self, delay: float | None = None) -> None:
        """Nor to hand back: the stream's copy is the retry."""

    async def in_progress(self) -> None:
        """Nor to keep."""


def message_id(msg: Msg | LaneMsg) -> str | None:
    return (msg.headers or {}).get(MSG_ID)


def is_lane(msg: Msg | LaneMsg) -> bool:
    return isinstance(msg, LaneMsg)


class Handled:
    """The ids of the messages a delivery handled lately: the other copy of each is skipped."""

    def __init__(self, size: int = REMEMBERED) -> None:
        self.size = size
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._ids

    def add(self, msg_id: str | None) -> None:
        if msg_id is None:
            return
        self._ids[msg_id] = None
        self._ids.move_to_end(msg_id)
        while len(self._ids) > self.size:
            self._ids.popitem(last=False)


@dataclass
class LaneGap:
    """The messages whose lane copy was not handled and whose stream copy is not yet settled
    (acknowledged or dead-lettered): while there is one, the lane is shut and messages come in
    the stream's order. A gap whose stream copy never comes closes after ``hold_s``."""

    hold_s: float = LANE_GAP_S
    clock: Callable[[], float] = time.monotonic
    _open: dict[str, float] = field(default_factory=dict)  # id: when the gap closes anyway

    def open(self, msg_id: str | None) -> None:
        if msg_id is not None:
            self._open.setdefault(msg_id, self.clock() + self.hold_s)

    def settled(self, msg_id: str | None) -> None:
        self._open.pop(msg_id or "", None)

    def shut(self) -> bool:
        """Whether a lane copy is to be passed over now."""
        now = self.clock()
        for msg_id in [m for m, until in self._open.items() if until <= now]:
            del self._open[msg_id]
        return bool(self._open)
