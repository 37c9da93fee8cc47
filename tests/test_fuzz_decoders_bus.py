"""Fuzzing the bus's decoders (see ``tests/fuzzing.py`` for the inputs):

- the bus parsers (``parse_event``, ``AGENT_COMMAND``, ``WORKER_REPORT``, the logs request and
  reply): each returns a model that re-encodes, or raises only what its caller turns into a
  dead letter or a refusal (``delivery.PARSE_ERRORS``; a ``ValidationError`` for the logs pair);
- ``Bus.consume`` itself, over a fake JetStream: each message is handled and acked, or
  dead-lettered and terminated; and the API's ``ask`` for logs, which refuses a bad reply.

The last test checks that the fuzz tests of all three modules add up to over 10,000 inputs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from fastapi import HTTPException
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from unicron.services.api.routes.logs import ask
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.bus.delivery import PARSE_ERRORS
from unicron.shared.contracts.logs import LogsReply, LogsRequest
from unicron.shared.contracts.messages import AGENT_COMMAND, DEADLETTER_SUBJECT, DeadLetter
from unicron.shared.contracts.reports import WORKER_REPORT

from tests.fuzzing import (
    ANY_INPUT,
    ARBITRARY_JSON,
    BUS_BYTES,
    BUS_CONSUME,
    BUS_JSON,
    BUS_NEAR_VALID,
    COMMANDS,
    EVENTS,
    LOGS_ASK,
    LOGS_REPLIES,
    LOGS_REQUESTS,
    REPORTS,
    TOTAL_EXAMPLES,
    as_json,
    fuzz,
    near_valid,
    run,
)
from tests.twins.jsmsg import RecordedMsg

Decoder = Callable[[bytes], object]


# (name, decoder, seeds, what its caller turns into a dead letter or a refusal)
BUS_DECODERS: list[tuple[str, Decoder, list[dict[str, Any]], tuple[type[Exception], ...]]] = [
    ("event", parse_event, as_json(list(EVENTS)), PARSE_ERRORS),
    ("command", AGENT_COMMAND.validate_json, as_json(COMMANDS), PARSE_ERRORS),
    ("report", WORKER_REPORT.validate_json, as_json(REPORTS), PARSE_ERRORS),
    ("logs request", LogsRequest.model_validate_json, as_json(LOGS_REQUESTS), (ValidationError,)),
    ("logs reply", LogsReply.model_validate_json, as_json(LOGS_REPLIES), (ValidationError,)),
]


def check_decoder(
    decode: Decoder, allowed: tuple[type[Exception], ...], raw: bytes
) -> BaseModel | None:
    """Decode ``raw``: a model that encodes again, or None after an allowed refusal."""
    try:
        decoded = decode(raw)
    except allowed:
        return None
    assert isinstance(decoded, BaseModel)
    decoded.model_dump_json()  # what a service forwards or stores must encode again
    return decoded


# --- the bus parsers -------------------------------------------------------------------


@fuzz(BUS_BYTES)
@given(raw=st.binary(max_size=2048))
def test_bus_decoders_refuse_arbitrary_bytes(raw: bytes) -> None:
    for _name, decode, _seeds, allowed in BUS_DECODERS:
        check_decoder(decode, allowed, raw)


@fuzz(BUS_JSON)
@given(raw=ARBITRARY_JSON)
def test_bus_decoders_refuse_arbitrary_json(raw: bytes) -> None:
    for _name, decode, _seeds, allowed in BUS_DECODERS:
        assert check_decoder(decode, allowed, raw) is None  # no random value is a message


@pytest.mark.extended  # the longest fuzz runs: CI's extended suite
@fuzz(BUS_NEAR_VALID)
@given(data=st.data())
def test_bus_decoders_refuse_near_valid_messages(data: st.DataObject) -> None:
    _name, decode, seeds, allowed = data.draw(st.sampled_from(BUS_DECODERS))
    check_decoder(decode, allowed, data.draw(near_valid(seeds)))


def test_bus_decoders_take_their_seeds() -> None:
    """The seeds are valid, so a near-valid message is one mutation away from a message."""
    for _name, decode, seeds, allowed in BUS_DECODERS:
        for seed in seeds:
            assert check_decoder(decode, allowed, json.dumps(seed).encode()) is not None


class FakeJetStream:
    """Just enough JetStream for ``Bus.consume``: keeps the callback and what is published."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []
        self.cb: Callable[[Any], Any] | None = None

    async def subscribe(self, subject: str, **kwargs: Any) -> FakeJetStream:
        self.cb = kwargs["cb"]
        return self

    async def publish(self, subject: str, payload: bytes, **_: Any) -> None:
        self.published.append((subject, payload))


CONSUMED: list[tuple[str, Decoder, list[dict[str, Any]]]] = [
    ("unicron.events.job.submitted", parse_event, as_json(list(EVENTS))),
    ("unicron.commands.agent.n1", AGENT_COMMAND.validate_json, as_json(COMMANDS)),
    ("unicron.reports.n1.step_completed", WORKER_REPORT.validate_json, as_json(REPORTS)),
]


async def consume_one(
    subject: str, parse: Decoder, raw: bytes
) -> tuple[RecordedMsg, Any, list[Any]]:
    js = FakeJetStream()

    async def lane(*_: Any, **__: Any) -> SimpleNamespace:  # the fast lane: nothing comes
        async def unsubscribe() -> None:
            pass

        return SimpleNamespace(unsubscribe=unsubscribe)

    # no connection to drain at the end
    closed = SimpleNamespace(is_closed=True, subscribe=lane)
    bus = Bus(cast(Any, closed), cast(Any, js), source="unicron/fuzz")
    handled: list[Any] = []

    async def handler(item: Any) -> None:
        handled.append(item)

    await bus.consume(subject, "fuzz", parse, handler)
    assert js.cb is not None
    msg = RecordedMsg(subject, raw)
    await js.cb(msg)  # queued: the consumer's task acks, terminates or hands it back
    async with asyncio.timeout(5):
        while not msg.outcomes:  # noqa: ASYNC110 (the fake message has no event to wait on)
            await asyncio.sleep(0)
    await bus.close()
    return msg, js, handled


@fuzz(BUS_CONSUME)
@given(data=st.data())
def test_consumers_dead_letter_what_they_cannot_parse(data: st.DataObject) -> None:
    subject, parse, seeds = data.draw(st.sampled_from(CONSUMED))
    raw = data.draw(st.one_of(ANY_INPUT, near_valid(seeds)))
    msg, js, handled = run(consume_one(subject, parse, raw))
    if handled:
        assert msg.outcomes == ["ack"] and js.published == []
        return
    assert msg.outcomes == ["term"]
    [(letter_subject, payload)] = js.published
    assert letter_subject == DEADLETTER_SUBJECT
    letter = DeadLetter.model_validate_json(payload)
    assert letter.subject == subject and letter.reason.startswith("invalid message")


@fuzz(LOGS_ASK)
@given(data=st.data())
def test_the_api_refuses_a_malformed_logs_reply(data: st.DataObject) -> None:
    raw = data.draw(st.one_of(ANY_INPUT, near_valid(as_json(LOGS_REPLIES))))

    async def request(subject: str, payload: bytes, timeout_s: float) -> bytes:
        return raw

    bus = cast(Bus, SimpleNamespace(request=request))
    try:
        reply = run(ask(bus, "n1", LOGS_REQUESTS[0]))
    except HTTPException as exc:
        assert exc.status_code == 502
    else:
        assert isinstance(reply, LogsReply)


def test_the_fuzzing_covers_ten_thousand_inputs() -> None:
    assert TOTAL_EXAMPLES >= 10_000
