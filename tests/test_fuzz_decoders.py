"""Fuzzing every decoder of a message from the bus or the worker channel (issue 11, item 5).

Three kinds of input — arbitrary bytes, arbitrary JSON, and near-valid messages (a valid one
with a field dropped, added, retyped, made huge or nested deep, then perhaps truncated, spliced
with bytes that are not UTF-8 or re-encoded) — go to:

- the bus parsers (``parse_event``, ``AGENT_COMMAND``, ``WORKER_REPORT``, the logs request and
  reply): each returns a model that re-encodes, or raises only what its caller turns into a
  dead letter or a refusal (``delivery.PARSE_ERRORS``; a ``ValidationError`` for the logs pair);
- ``Bus.consume`` itself, over a fake JetStream: each message is handled and acked, or
  dead-lettered and terminated;
- the agent's side of the worker channel (``WorkerChannel``): a line is forwarded, bound as a
  hello or dead-lettered, never raises, and a valid report still goes through after it;
- the worker's side: ``AgentChannel._deliver`` into the inboxes (never raises, and takes a
  valid directive afterwards), ``parse_directive`` (a directive or ``DirectiveError``), the
  spare's ``_launch_of`` and the worker's ``read_launch`` (a launch, or ``ValueError``).

The examples add up to ``TOTAL_EXAMPLES`` (over 10,000); a test at the end checks the sum.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import pytest
from fastapi import HTTPException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from unicron.services.agent.channel import AGENT_ONLY, MAX_LINE, WorkerChannel, _Conn
from unicron.services.agent.outbox import Report
from unicron.services.agent.supervisor import WorkerKey
from unicron.services.api.routes.logs import ask
from unicron.shared.bus.bus import Bus, parse_event
from unicron.shared.bus.delivery import PARSE_ERRORS
from unicron.shared.contracts.events import (
    CloudEvent,
    FailureDetected,
    JobStateChanged,
    JobSubmitted,
)
from unicron.shared.contracts.logs import LogsReply, LogsRequest
from unicron.shared.contracts.messages import (
    AGENT_COMMAND,
    DEADLETTER_SUBJECT,
    DeadLetter,
    FaultKind,
    FaultSpec,
    InjectFault,
    RegroupDirective,
    RegroupWorker,
    Rendezvous,
    StartWorker,
    StopWorkers,
)
from unicron.shared.contracts.models import JobSpec, JobState
from unicron.shared.contracts.reports import (
    WORKER_REPORT,
    StepCompleted,
    WorkerException,
    WorkerExited,
    WorkerHello,
    WorkerHung,
    WorkerPhase,
    WorkerRegrouped,
    WorkerStarted,
)
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind, RecoveryAction, Severity
from unicron.shared.contracts.workerchannel import (
    DirectiveError,
    FaultDirective,
    ScriptLaunch,
    SpareLaunch,
    WorkerLaunch,
    env_name,
    parse_directive,
)
from unicron.trainer.channel import AgentChannel
from unicron.trainer.faults import FaultInbox
from unicron.trainer.regroup import RegroupInbox
from unicron.trainer.runtime import directive_router
from unicron.trainer.spare import _launch_of
from unicron.trainer.worker import read_launch

from tests.twins.jsmsg import RecordedMsg

Decoder = Callable[[bytes], object]
T = TypeVar("T")

# --- examples per test (the sum is checked below) ------------------------------------------

BUS_BYTES = 4000
BUS_JSON = 600
BUS_NEAR_VALID = 1500
BUS_CONSUME = 500
LOGS_ASK = 200
AGENT_LINES = 1000
AGENT_STREAM = 100
WORKER_DELIVER = 900
WORKER_OFFER = 500
SPARE_LAUNCH = 500
READ_LAUNCH = 300
TOTAL_EXAMPLES = (
    BUS_BYTES
    + BUS_JSON
    + BUS_NEAR_VALID
    + BUS_CONSUME
    + LOGS_ASK
    + AGENT_LINES
    + AGENT_STREAM
    + WORKER_DELIVER
    + WORKER_OFFER
    + SPARE_LAUNCH
    + READ_LAUNCH
)


def fuzz(examples: int) -> settings:
    """Hypothesis settings for one fuzz test: ``examples`` inputs, no per-example deadline
    (a shared CPU makes timings noisy), and big generated inputs are intended."""
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --- valid messages, the seeds of the near-valid ones --------------------------------------

SPEC = JobSpec(name="fuzz", env={"A": "1"}, entrypoint=["python", "train.py"])
SEAT: dict[str, Any] = {
    "job_id": "job-a",
    "generation": 2,
    "rank": 0,
    "world_size": 2,
    "rendezvous": Rendezvous(host="10.0.0.1", port=29500, prefix="job-a/2"),
}
IDS: dict[str, Any] = {"node_id": "n1", "job_id": "job-a", "generation": 1, "rank": 0}
LAUNCH = WorkerLaunch(
    **SEAT, node_id="n1", spec=SPEC, checkpoint_dir="/ckpt", agent_socket="/run/a.sock"
)
REGROUP = RegroupDirective(**SEAT, state_source_rank=1)
FAULT = FaultDirective(fault=FaultSpec(rank=0, kind=FaultKind.EXCEPTION, message="boom"))

EVENTS = [
    CloudEvent.wrap(JobSubmitted(job_id="job-a", name="fuzz", spec=SPEC), "fuzz"),
    CloudEvent.wrap(
        JobStateChanged(job_id="job-a", old=JobState.PENDING, new=JobState.STARTING, reason=""),
        "fuzz",
    ),
    CloudEvent.wrap(
        FailureDetected(
            failure_id="f1",
            job_id="job-a",
            node_id="n1",
            rank=0,
            kind=FailureKind.CRASH,
            category=FailureCategory.NCCL_TIMEOUT,
            severity=Severity.SEV2,
            action=RecoveryAction.RESTART,
            observed_at=1.0,
            evidence={"lines": ["a", "b"], "deep": {"x": [1, 2.5, None]}},
        ),
        "fuzz",
    ),
]
COMMANDS: list[BaseModel] = [
    StartWorker(**SEAT, local_rank=1, local_world_size=2),
    StopWorkers(job_id="job-a", below_generation=3, reason="regroup"),
    InjectFault(job_id="job-a", generation=2, rank=0, fault=FAULT.fault),
    RegroupWorker(job_id="job-a", from_generation=1, from_rank=0, directive=REGROUP),
]
REPORTS: list[BaseModel] = [
    WorkerStarted(**IDS, pid=10),
    WorkerExited(**IDS, pid=10, exit_code=None, signal=9),
    StepCompleted(**IDS, step=3, loss=0.5, iteration_s=0.1, compute_s=0.05),
    WorkerException(**IDS, pid=10, exc_type="RuntimeError", message="x", category="software"),
    WorkerPhase(**IDS, phase="collective", step=3),
    WorkerHung(
        **IDS, pid=10, silent_s=9, threshold_s=3, mean_iteration_s=1, process_state="D", phase="x"
    ),
    WorkerRegrouped(
        **IDS, pid=10, world_size=2, regroup_s=0.2, state_source="peer", resumed_step=4
    ),
]
LOGS_REQUESTS = [LogsRequest(job_id="job-a", generation=1, rank=0, tail=10)]
LOGS_REPLIES = [LogsReply(found=True, running=True, data=b"\x00\xfflog\n", next_offset=6, size=6)]
HELLOS = [WorkerHello(job_id="job-a", generation=1, rank=0)]
DIRECTIVES: list[BaseModel] = [
    FAULT,
    FaultDirective(fault=FaultSpec(rank=0, kind=FaultKind.SLOW, slowdown=3.0, at_step=5)),
    REGROUP,
    SpareLaunch(launch=LAUNCH, script=ScriptLaunch(argv=["python", "-m", "pkg.trainer"], env={})),
    SpareLaunch(launch=LAUNCH, script=ScriptLaunch(argv=["python", "x.py"], env={}, cwd="/w")),
]


def as_json(models: Sequence[BaseModel]) -> list[dict[str, Any]]:
    return [m.model_dump(mode="json") for m in models]


# (name, decoder, seeds, what its caller turns into a dead letter or a refusal)
BUS_DECODERS: list[tuple[str, Decoder, list[dict[str, Any]], tuple[type[Exception], ...]]] = [
    ("event", parse_event, as_json(list(EVENTS)), PARSE_ERRORS),
    ("command", AGENT_COMMAND.validate_json, as_json(COMMANDS), PARSE_ERRORS),
    ("report", WORKER_REPORT.validate_json, as_json(REPORTS), PARSE_ERRORS),
    ("logs request", LogsRequest.model_validate_json, as_json(LOGS_REQUESTS), (ValidationError,)),
    ("logs reply", LogsReply.model_validate_json, as_json(LOGS_REPLIES), (ValidationError,)),
]

# --- strategies ------------------------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=24)
    | st.sampled_from(["", "\x00", "\ud800", "job-a", "n1", "launch", "regroup", "fault"])
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
# Values to put where a field was: other types, extremes, sizes far past any bound.
ODD_VALUES = JSON_VALUES | st.sampled_from(
    [
        "x" * 5000,
        "y" * 100_000,
        2**63,
        -(2**63) - 1,
        10**400,
        1e308,
        -0.0,
        float("nan"),
        float("inf"),
        [0] * 5000,
        {f"k{i}": i for i in range(2000)},
        {"directive": "launch"},
        {"kind": "hello"},
    ]
)
# Raw JSON text spliced in where a value was: nesting and numbers past the parsers' limits.
RAW_TEXT = st.one_of(
    st.integers(1, 4000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 4000).map(lambda n: '{"a":' * n + "0" + "}" * n),
    st.integers(1, 4000).map(lambda n: "[" * n),
    st.sampled_from(["1" * 5000, "1e999999", "-1e-999999", "NaN", "Infinity", "-Infinity", "01"]),
)
RAW_TOKEN = "\x00raw\x00"


@st.composite
def near_valid(draw: st.DrawFn, seeds: list[dict[str, Any]]) -> bytes:
    """One of ``seeds`` with one to three fields dropped, added or replaced (in it or a nested
    object), then encoded — perhaps spliced with raw text, broken bytes or another encoding."""
    message = json.loads(json.dumps(draw(st.sampled_from(seeds))))
    raw: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        target = message
        while True:  # walk down into a nested object, sometimes
            nested = [k for k, v in target.items() if isinstance(v, dict)]
            if not nested or draw(st.booleans()):
                break
            target = target[draw(st.sampled_from(nested))]
        keys = sorted(target)
        how = draw(st.sampled_from(["drop", "add", "replace", "replace", "raw"]))
        if how == "drop" and keys:
            del target[draw(st.sampled_from(keys))]
        elif how == "add" or not keys:
            target[draw(st.text(max_size=12))] = copy.deepcopy(draw(ODD_VALUES))
        elif how == "replace":
            target[draw(st.sampled_from(keys))] = copy.deepcopy(draw(ODD_VALUES))
        else:
            target[draw(st.sampled_from(keys))] = f"{RAW_TOKEN}{len(raw)}"
            raw.append(draw(RAW_TEXT))
    text = json.dumps(message)
    for i, splice in enumerate(raw):
        text = text.replace(json.dumps(f"{RAW_TOKEN}{i}"), splice)
    return draw(encoded(text))


@st.composite
def encoded(draw: st.DrawFn, text: str) -> bytes:
    data = text.encode()
    how = draw(
        st.sampled_from(
            ["plain", "plain", "plain", "truncate", "insert", "bom", "utf16", "dupkey", "array"]
        )
    )
    if how == "truncate":
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    if how == "insert":
        at = draw(st.integers(0, len(data)))
        junk = draw(st.binary(min_size=1, max_size=8) | st.sampled_from([b"\xff", b"\xc0\x80"]))
        return data[:at] + junk + data[at:]
    if how == "bom":
        return b"\xef\xbb\xbf" + data
    if how == "utf16":
        return text.encode("utf-16")
    if how == "dupkey" and data.endswith(b"}"):
        return data[:-1] + b', "kind": "start_worker", "directive": "fault"}'
    if how == "array":
        return b"[" + data + b"]"
    return data


ARBITRARY_JSON = JSON_VALUES.map(lambda v: json.dumps(v).encode("utf-8", "surrogatepass"))
ANY_INPUT = st.one_of(st.binary(max_size=512), ARBITRARY_JSON)


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


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a loop of its own, leaving the thread's current loop alone."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


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


# --- the agent's side of the worker channel --------------------------------------------


class ListSink:
    def __init__(self) -> None:
        self.reports: list[Report] = []
        self.letters: list[tuple[str, bytes, str]] = []

    def report(self, report: Report) -> None:
        self.reports.append(report)

    def dead_letter(self, subject: str, payload: bytes, reason: str) -> None:
        self.letters.append((subject, payload, reason))


def agent_channel() -> tuple[WorkerChannel, ListSink, list[Report]]:
    sink = ListSink()
    observed: list[Report] = []
    channel = WorkerChannel(
        Path("/nonexistent/fuzz.sock"),
        "n1",
        sink,
        observe=lambda _key, report: observed.append(report),
    )
    return channel, sink, observed


WORKER_LINE_SEEDS = as_json(REPORTS) + as_json(HELLOS)
VALID_STEP = StepCompleted(**IDS, step=7, loss=0.1, iteration_s=0.1).model_dump_json().encode()


@fuzz(AGENT_LINES)
@given(
    line=st.one_of(ANY_INPUT, near_valid(WORKER_LINE_SEEDS)).map(bytes.strip),
    launched=st.sampled_from([None, WorkerKey("job-a", 1, 0), WorkerKey("job-b", 1, 0)]),
)
def test_the_agent_forwards_binds_or_dead_letters_each_line(
    line: bytes, launched: WorkerKey | None
) -> None:
    channel, sink, observed = agent_channel()
    conn = _Conn(cast(asyncio.StreamWriter, None), launched)
    if line:
        channel._on_line(line, conn)  # must not raise: that would drop the worker's connection
    outcomes = len(sink.letters) + len(observed)
    if outcomes == 0:  # the one line taken without a word: a hello, which binds the worker
        hello = WorkerHello.model_validate_json(line) if line else None
        assert hello is None or WorkerKey(hello.job_id, hello.generation, hello.rank) in conn.keys
    else:
        assert outcomes == 1
    for report in sink.reports:  # what reaches the bus speaks for this node, as a worker
        assert report.node_id == "n1" and not isinstance(report, AGENT_ONLY)
        assert launched is None or report.job_id == launched.job_id
    assert all(subject == "agent.n1.channel" for subject, _, _ in sink.letters)
    before = len(sink.reports)
    channel._on_line(VALID_STEP, conn)
    if launched is None or launched.job_id == "job-a":
        assert len(sink.reports) == before + 1


async def read_stream(channel: WorkerChannel, conn: _Conn, stream: bytes) -> None:
    reader = asyncio.StreamReader(limit=MAX_LINE)
    reader.feed_data(stream)
    reader.feed_eof()
    await channel._read_lines(reader, conn)


@fuzz(AGENT_STREAM)
@given(lines=st.lists(st.one_of(ANY_INPUT, near_valid(WORKER_LINE_SEEDS)), max_size=8))
def test_the_agent_reads_a_stream_of_bad_lines_to_its_end(lines: list[bytes]) -> None:
    channel, sink, _observed = agent_channel()
    conn = _Conn(cast(asyncio.StreamWriter, None), None)
    stream = b"\n".join(lines) + b"\n" + VALID_STEP  # the last, valid line has no newline
    run(read_stream(channel, conn, stream))
    assert sink.reports and sink.reports[-1].model_dump_json().encode() == VALID_STEP


def test_the_agent_refuses_a_line_over_the_limit_and_reads_on() -> None:
    channel, sink, _observed = agent_channel()
    conn = _Conn(cast(asyncio.StreamWriter, None), None)
    huge = b'{"kind": "step_completed", "x": "' + b"y" * MAX_LINE + b'"}\n'
    run(read_stream(channel, conn, huge + b"[" * (MAX_LINE + 10) + b"\n" + VALID_STEP))
    assert [reason for _, _, reason in sink.letters] == ["line longer than the limit"] * 2
    assert len(sink.reports) == 1


# --- the worker's side of the channel --------------------------------------------------

DIRECTIVE_SEEDS = as_json(DIRECTIVES)


@pytest.fixture(scope="module")
def worker_channel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentChannel]:
    """A worker's channel to an agent that is not there: only its reader's parser is used."""
    channel = AgentChannel(str(tmp_path_factory.mktemp("fuzz") / "absent.sock"))
    yield channel
    channel.close()


def inboxes(channel: AgentChannel) -> tuple[FaultInbox, RegroupInbox]:
    """The inboxes wired to ``channel`` as ``Runtime`` wires them."""
    faults, regroups = FaultInbox(0), RegroupInbox("job-a", 1)
    channel.on_directive = directive_router(faults, regroups)
    return faults, regroups


def assert_still_takes_directives(
    deliver: Callable[[bytes], None], faults: FaultInbox, regroups: RegroupInbox
) -> None:
    """After whatever came before, a valid fault and a valid regroup are still taken."""
    faults.due(sys.maxsize)
    regroups.take()
    regroups.generation = 1
    deliver(FAULT.model_dump_json().encode())
    assert faults.due(1) == [FAULT.fault]
    deliver(REGROUP.model_dump_json().encode())
    pending = regroups.take()
    assert pending is not None and pending.directive == REGROUP


@pytest.mark.extended  # the longest fuzz runs: CI's extended suite
@fuzz(WORKER_DELIVER)
@given(line=st.one_of(ANY_INPUT, near_valid(DIRECTIVE_SEEDS)))
def test_the_worker_never_fails_on_a_directive_line(
    worker_channel: AgentChannel, line: bytes
) -> None:
    faults, regroups = inboxes(worker_channel)
    worker_channel._deliver(line)  # must not raise: that would end the reader thread
    assert_still_takes_directives(worker_channel._deliver, faults, regroups)


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def deepest_parsed() -> int:
    """The deepest nesting ``json.loads`` takes from here (its limit is the stack's)."""
    lo, hi = 0, sys.getrecursionlimit()
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            json.loads(nested(mid))
            lo = mid
        except RecursionError:
            hi = mid - 1
    return lo


def test_the_worker_survives_directives_nested_to_the_parsers_limit(
    worker_channel: AgentChannel,
) -> None:
    """Nested past what ``json.loads`` takes, a line raises ``RecursionError``, not
    ``ValueError``: the reader must still take it as a line that is not JSON."""
    faults, regroups = inboxes(worker_channel)
    deepest = deepest_parsed()  # _deliver calls json.loads as deep in the stack as this does
    for depth in range(max(0, deepest - 40), deepest + 5):
        for kind in (b"noise", b"fault", b"regroup", b"launch"):
            worker_channel._deliver(b'{"directive": "%s", "a": %s}' % (kind, nested(depth)))
            assert_still_takes_directives(worker_channel._deliver, faults, regroups)
    outcomes: set[object] = set()
    for depth in range(max(0, deepest - 40), deepest + 5):
        try:  # too deep to parse, it is noise; else a launch with a field too many
            outcomes.add(_launch_of(b'{"directive": "launch", "a": %s}\n' % nested(depth)))
        except ValueError as exc:
            assert str(exc).startswith("not a valid SpareLaunch")
            outcomes.add("refused")
    assert outcomes == {None, "refused"}


def loads_or_empty(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return {}


@pytest.mark.extended  # the longest fuzz runs: CI's extended suite
@fuzz(WORKER_OFFER)
@given(
    directive=st.one_of(
        st.dictionaries(st.text(max_size=10), ODD_VALUES, max_size=5),
        st.fixed_dictionaries(
            {"directive": st.sampled_from(["fault", "regroup", "launch"]) | JSON_VALUES},
            optional={"fault": ODD_VALUES, "job_id": ODD_VALUES, "generation": ODD_VALUES},
        ),
        near_valid(DIRECTIVE_SEEDS).map(loads_or_empty).filter(lambda v: isinstance(v, dict)),
    )
)
def test_a_directive_object_is_parsed_or_refused(
    worker_channel: AgentChannel, directive: dict[str, Any]
) -> None:
    """Any JSON object is a valid directive or a ``DirectiveError`` — never another error,
    and never a half-parsed dict reaching an inbox."""
    line = json.dumps(directive).encode()
    try:
        parsed = parse_directive(line)
    except DirectiveError:
        pass
    else:
        assert isinstance(parsed, SpareLaunch | RegroupDirective | FaultDirective)
    faults, regroups = inboxes(worker_channel)
    worker_channel._deliver(line)
    assert_still_takes_directives(worker_channel._deliver, faults, regroups)


@fuzz(SPARE_LAUNCH)
@given(line=st.one_of(ANY_INPUT, near_valid(DIRECTIVE_SEEDS)).map(lambda raw: raw + b"\n"))
def test_a_spare_takes_a_launch_ignores_noise_and_refuses_a_bad_launch(line: bytes) -> None:
    try:
        launch = _launch_of(line)
    except ValueError as exc:  # wait_for_launch's caller exits EXIT_BAD_LAUNCH: a refusal
        assert str(exc).startswith("not a valid SpareLaunch")
    else:
        assert launch is None or isinstance(launch, SpareLaunch)
    spare_launch = DIRECTIVES[-1]
    assert _launch_of(spare_launch.model_dump_json().encode() + b"\n") == spare_launch


@fuzz(READ_LAUNCH)
@given(raw=st.one_of(ANY_INPUT, near_valid(as_json([LAUNCH]))))
def test_a_worker_reads_its_launch_or_refuses_it(raw: bytes) -> None:
    environ = {env_name("launch"): raw.decode("utf-8", "replace")}
    try:
        launch = read_launch(environ)
    except ValueError:
        return
    assert isinstance(launch, WorkerLaunch)


def test_the_fuzzing_covers_ten_thousand_inputs() -> None:
    assert TOTAL_EXAMPLES >= 10_000
