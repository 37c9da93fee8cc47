"""A worker's identity, defined once (``unicron.shared.contracts.identity``): the reports and the
seats of the commands take it as a base and keep their JSON flat and in the order it always had."""

from __future__ import annotations

import json

from unicron.shared.contracts.identity import JobRank, WorkerIdentity, WorkerKey
from unicron.shared.contracts.messages import Rendezvous, StartWorker
from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.reports import WORKER_REPORT, WorkerExited, WorkerStarted
from unicron.shared.contracts.workerchannel import WorkerLaunch

IDS = {"node_id": "n1", "job_id": "job-a", "generation": 2, "rank": 1}
RENDEZVOUS = Rendezvous(host="127.0.0.1", port=29500, prefix="job-a/g2")


def test_a_report_carries_the_identity_flat_and_first() -> None:
    report = WorkerExited(**IDS, pid=7, exit_code=1, at=5.0)
    assert isinstance(report, WorkerIdentity)
    raw = report.model_dump_json()
    assert raw.startswith('{"node_id":"n1","job_id":"job-a","generation":2,"rank":1,"at":5.0,')
    assert WORKER_REPORT.validate_json(raw) == report
    assert report.key == WorkerKey("job-a", 2, 1)


def test_the_key_is_hashable_and_makes_a_report() -> None:
    key = WorkerKey("job-a", 2, 1)
    assert {key: 1}[WorkerKey(**key._asdict())] == 1
    started = WorkerStarted(node_id="n1", **key._asdict(), pid=3)
    assert started.model_dump(include=set(IDS)) == IDS


def test_a_seat_is_a_job_rank_with_its_fields_in_place() -> None:
    cmd = StartWorker(job_id="job-a", generation=2, rank=1, world_size=2, rendezvous=RENDEZVOUS)
    assert isinstance(cmd, JobRank) and cmd.key == WorkerKey("job-a", 2, 1)
    assert list(json.loads(cmd.model_dump_json()))[:4] == [
        "job_id",
        "generation",
        "rank",
        "world_size",
    ]
    launch = WorkerLaunch(
        **IDS, world_size=2, rendezvous=RENDEZVOUS, spec=JobSpec(name="x", steps=1),
        checkpoint_dir="/c", agent_socket="/s",
    )  # fmt: skip
    assert launch.key == cmd.key
