"""Fuzzing the worker's side of the channel (the inputs are ``tests/fuzzing.py``'s):
``AgentChannel._deliver`` into the inboxes (never raises, and takes a valid directive
afterwards), ``parse_directive`` (a directive or ``DirectiveError``), the spare's
``_launch_of`` and the worker's ``read_launch`` (a launch, or ``ValueError``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from unicron.shared.contracts.messages import RegroupDirective
from unicron.shared.contracts.workerchannel import (
    DirectiveError,
    FaultDirective,
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

from tests.fuzzing import (
    ANY_INPUT,
    DIRECTIVES,
    FAULT,
    JSON_VALUES,
    LAUNCH,
    ODD_VALUES,
    READ_LAUNCH,
    REGROUP,
    SPARE_LAUNCH,
    WORKER_DELIVER,
    WORKER_OFFER,
    as_json,
    fuzz,
    near_valid,
)

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
