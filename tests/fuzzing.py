"""What the decoder fuzz tests share (issue 11, item 5): the examples each test runs, the valid
messages their near-valid inputs are mutated from, and the strategies that make the inputs.

Three kinds of input — arbitrary bytes, arbitrary JSON, and near-valid messages (a valid one
with a field dropped, added, retyped, made huge or nested deep, then perhaps truncated, spliced
with bytes that are not UTF-8 or re-encoded) — go to every decoder of a message from the bus or
the worker channel: the bus's (``tests/test_fuzz_decoders_bus.py``), the agent's side of the
worker channel (``tests/test_fuzz_decoders_agent.py``) and the worker's side
(``tests/test_fuzz_decoders_worker.py``).

The examples add up to ``TOTAL_EXAMPLES`` (over 10,000); a test of the bus module checks the sum.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from unicron.shared.contracts.events import (
    CloudEvent,
    FailureDetected,
    JobStateChanged,
    JobSubmitted,
)
from unicron.shared.contracts.logs import LogsReply, LogsRequest
from unicron.shared.contracts.messages import (
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
    FaultDirective,
    ScriptLaunch,
    SpareLaunch,
    WorkerLaunch,
)

T = TypeVar("T")

# --- examples per test (test_fuzz_decoders_bus checks the sum) ------------------------------------

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


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a loop of its own, leaving the thread's current loop alone."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
