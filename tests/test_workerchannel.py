"""The agent ↔ worker contract: what an agent writes, a worker reads back unchanged."""

from __future__ import annotations

import pytest
from unicron.shared.contracts.messages import FaultKind, FaultSpec, RegroupDirective, Rendezvous
from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.workerchannel import (
    DirectiveError,
    FaultDirective,
    ScriptLaunch,
    SpareLaunch,
    WorkerEnv,
    WorkerLaunch,
    directive_line,
    env_name,
    parse_directive,
)

SEAT = {"job_id": "job-a", "generation": 3, "rank": 1, "world_size": 2}
RENDEZVOUS = Rendezvous(host="10.0.0.2", port=29500, prefix="job-a/g3/")
LAUNCH = WorkerLaunch(
    **SEAT,
    rendezvous=RENDEZVOUS,
    node_id="n1",
    spec=JobSpec(name="tiny", steps=7),
    checkpoint_dir="/data/ckpt/job-a",
    agent_socket="/data/agent.sock",
)


def test_the_environment_an_agent_writes_is_the_one_a_worker_reads() -> None:
    written = WorkerEnv(
        launch=LAUNCH, agent_socket="/data/agent.sock", job_id="job-a", checkpoint_dir="/c"
    ).to_environ()
    assert set(written) == {
        "UNICRON_WORKER_LAUNCH",
        "UNICRON_AGENT_SOCKET",
        "UNICRON_JOB_ID",
        "UNICRON_CHECKPOINT_DIR",
    }  # an operator's UNICRON_PARK_TIMEOUT_S, inherited by the worker, is not overwritten
    read = WorkerEnv.read({**written, "PATH": "/bin", "UNICRON_PARK_TIMEOUT_S": "5"})
    assert read.launch == LAUNCH  # defaults inside the spec travel too
    assert read.launch is not None and read.launch.spec.seed == JobSpec(name="x").seed
    assert (read.job_id, read.checkpoint_dir, read.park_timeout_s) == ("job-a", "/c", 5.0)
    assert WorkerEnv(spare=True).to_environ() == {"UNICRON_WORKER_SPARE": "1"}
    assert WorkerEnv.read({"UNICRON_WORKER_SPARE": "1"}).spare


@pytest.mark.parametrize(
    ("raw", "says"),
    [("", "not JSON"), ("{", "not JSON"), ("[]", "dictionary"), ('{"rank": 1}', "Field required")],
)
def test_a_bad_launch_is_refused_naming_the_variable(raw: str, says: str) -> None:
    with pytest.raises(ValueError, match="UNICRON_WORKER_LAUNCH is not a valid WorkerLaunch") as e:
        WorkerEnv.read({env_name("launch"): raw})
    assert says in str(e.value)


@pytest.mark.parametrize(
    "directive",
    [
        SpareLaunch(launch=LAUNCH, script=ScriptLaunch(argv=["python", "-m", "pkg.t"], env={})),
        SpareLaunch(launch=LAUNCH, script=ScriptLaunch(argv=["python", "t.py"], env={"A": "1"})),
        RegroupDirective(**SEAT, rendezvous=RENDEZVOUS, state_source_rank=0),
        FaultDirective(fault=FaultSpec(rank=1, kind=FaultKind.EXIT, exit_code=3, at_step=9)),
        FaultDirective(fault=FaultSpec(rank=1, kind=FaultKind.SLOW, slowdown=4.0)),
    ],
)
def test_every_directive_reads_back_as_itself(
    directive: SpareLaunch | RegroupDirective | FaultDirective,
) -> None:
    line = directive_line(directive)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # one line on the channel
    assert parse_directive(line) == directive


@pytest.mark.parametrize(
    ("line", "name"),
    [
        (b"not json", None),
        (b"[1, 2]", None),
        (b'{"directive": "reboot"}', "reboot"),
        (b'{"directive": "launch", "launch": {}}', "launch"),
        # a spare runs no trainer of its own: a launch must name what to run
        (b'{"directive": "launch", "launch": %s}' % LAUNCH.model_dump_json().encode(), "launch"),
        (b'{"directive": "fault", "fault": {"rank": 0, "kind": "melt"}}', "fault"),
        (b'{"fault": {"rank": 0, "kind": "crash"}}', None),
    ],
)
def test_a_line_that_is_not_a_directive_is_refused(line: bytes, name: str | None) -> None:
    with pytest.raises(DirectiveError) as refused:
        parse_directive(line)
    assert refused.value.name == name  # what a spare uses to tell a broken launch from noise
