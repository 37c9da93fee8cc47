"""A message that comes twice, from its stream and from the fast lane: handled once, and a
lane copy is never acknowledged, retried or dead-lettered (its stream copy is the record)."""

from __future__ import annotations

from typing import Any, cast

from unicron.shared.bus.delivery import Delivery
from unicron.shared.bus.lane import LaneMsg
from unicron.shared.outage import Outage

from tests.twins.jsmsg import RecordedMsg


def StoredMsg(msg_id: str, data: bytes = b"x") -> RecordedMsg:
    """A JetStream message of the events stream with its id."""
    return RecordedMsg("unicron.events.job.submitted", data, msg_id)


def lane_copy(msg: StoredMsg) -> LaneMsg:
    return LaneMsg(msg.subject, msg.data, dict(msg.headers))


def delivery(handled: list[bytes], fail_first: bool = False) -> tuple[Delivery[bytes], list[str]]:
    letters: list[str] = []

    async def handler(item: bytes) -> None:
        if fail_first and not handled:
            handled.append(b"failed")
            raise RuntimeError("a bug, once")
        handled.append(item)

    async def dead_letter(subject: str, payload: bytes, reason: str, deliveries: int) -> None:
        letters.append(reason)

    parse: Any = bytes
    return Delivery(parse, handler, None, dead_letter, Outage("t"), lambda: None), letters


async def test_the_copy_that_comes_second_is_skipped_and_a_stored_one_acked() -> None:
    handled: list[bytes] = []
    consumer, _ = delivery(handled)
    first = StoredMsg("m-1")
    await consumer.on_messages([lane_copy(first)])
    await consumer.on_messages([cast(Any, first)])
    assert handled == [b"x"] and first.outcomes == ["ack"]

    second = StoredMsg("m-2")  # the stream's copy first this time
    await consumer.on_messages([cast(Any, second)])
    await consumer.on_messages([lane_copy(second)])
    assert handled == [b"x", b"x"] and second.outcomes == ["ack"]


async def test_both_copies_in_one_batch_are_handled_once_from_the_stream() -> None:
    handled: list[bytes] = []
    consumer, _ = delivery(handled)
    stored = StoredMsg("m-1")
    await consumer.on_messages([lane_copy(stored), cast(Any, stored)])
    assert handled == [b"x"] and stored.outcomes == ["ack"]


async def test_a_lane_copy_whose_handler_failed_is_left_to_its_stream_copy() -> None:
    handled: list[bytes] = []
    consumer, letters = delivery(handled, fail_first=True)
    stored = StoredMsg("m-1")
    await consumer.on_messages([lane_copy(stored)])  # fails: nothing dead-lettered or acked
    assert letters == [] and stored.outcomes == []
    await consumer.on_messages([cast(Any, stored)])
    assert handled == [b"failed", b"x"] and stored.outcomes == ["ack"]


async def test_a_lane_copy_that_does_not_parse_is_not_dead_lettered() -> None:
    handled: list[bytes] = []
    consumer, letters = delivery(handled)

    def refuse(raw: bytes) -> bytes:
        raise ValueError("not a message")

    consumer.parse = refuse
    await consumer.on_messages([lane_copy(StoredMsg("m-1"))])
    assert letters == [] and handled == []
    stored = StoredMsg("m-1")
    await consumer.on_messages([cast(Any, stored)])  # the stored copy is judged
    assert len(letters) == 1 and stored.outcomes == ["term"]
