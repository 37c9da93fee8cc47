"""A message that comes twice, from its stream and from the fast lane: handled once, and a
lane copy is never acknowledged, retried or dead-lettered (its stream copy is the record)."""

from __future__ import annotations

from typing import Any, cast

from unicron.shared.bus.delivery import Delivery
from unicron.shared.bus.lane import LaneGap, LaneMsg
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


async def test_both_copies_in_one_batch_are_handled_where_the_first_came() -> None:
    """A busy consumer's queue: the lane copies of a rank's last steps, the lane copy of its
    exit, then the stream copies of the steps. The steps are handled where their lane copies
    came, before the exit: taken at their stream copies' place, the exit overtook them and the
    finished job kept the step before them (an extended run: SUCCEEDED at step 21 of 30)."""
    handled: list[bytes] = []
    consumer, _ = delivery(handled)
    steps = [StoredMsg(f"s-{n}", f"step {n}".encode()) for n in (29, 30)]
    exit_ = StoredMsg("e-0", b"exit")
    queue: list[Any] = [*map(lane_copy, steps), lane_copy(exit_), *steps]
    await consumer.on_messages(queue)
    assert handled == [b"step 29", b"step 30", b"exit"]
    assert [s.outcomes for s in steps] == [["ack"], ["ack"]]  # handled from the record
    await consumer.on_messages([cast(Any, exit_)])  # the exit's own stream copy, later
    assert handled == [b"step 29", b"step 30", b"exit"] and exit_.outcomes == ["ack"]


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


def failing_once(handled: list[bytes], bad: bytes) -> Delivery[bytes]:
    """A delivery whose handler fails the first time it gets ``bad``."""
    failed: list[bytes] = []

    async def handler(item: bytes) -> None:
        if item == bad and not failed:
            failed.append(item)
            raise RuntimeError("a claim not yet true, once")
        handled.append(item)

    async def dead_letter(subject: str, payload: bytes, reason: str, deliveries: int) -> None:
        raise AssertionError(reason)

    parse: Any = bytes
    return Delivery(parse, handler, None, dead_letter, Outage("t"), lambda: None)


async def test_a_lane_copy_not_handled_is_not_overtaken_by_the_next_ones() -> None:
    """A rank's last step whose lane copy failed must still be applied before its exit, which
    comes next on the lane: the lane shuts until the step's stream copy is settled."""
    handled: list[bytes] = []
    consumer = failing_once(handled, b"last step")
    step, exit_ = StoredMsg("m-step", b"last step"), StoredMsg("m-exit", b"exit")
    await consumer.on_messages([lane_copy(step)])
    await consumer.on_messages([lane_copy(exit_)])  # passed over: its stream copy follows
    assert handled == []
    await consumer.on_messages([cast(Any, step)])
    await consumer.on_messages([cast(Any, exit_)])
    assert handled == [b"last step", b"exit"]
    assert step.outcomes == ["ack"] and exit_.outcomes == ["ack"]
    later = StoredMsg("m-later", b"later")  # both settled: the lane is open again
    await consumer.on_messages([lane_copy(later)])
    assert handled[-1] == b"later"


async def test_in_a_batch_the_lane_copies_after_one_not_handled_wait_for_the_stream() -> None:
    handled: list[bytes] = []
    consumer = failing_once(handled, b"last step")
    step, exit_ = StoredMsg("m-step", b"last step"), StoredMsg("m-exit", b"exit")
    await consumer.on_messages([lane_copy(step), lane_copy(exit_)])
    assert handled == []
    await consumer.on_messages([cast(Any, step), cast(Any, exit_)])
    assert handled == [b"last step", b"exit"]


async def test_a_gap_whose_stream_copy_never_comes_opens_the_lane_again() -> None:
    now = [0.0]
    gap = LaneGap(hold_s=30.0, clock=lambda: now[0])
    gap.open("m-1")
    assert gap.shut()
    now[0] = 29.0
    assert gap.shut()
    now[0] = 30.5
    assert not gap.shut()
