"""Checkpoints in object storage, against a local S3 server (moto): uploads that are listed,
pruned and downloaded intact, half uploads that are never read, and a restart on nodes that
kept nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from unicron.shared.contracts.workerchannel import WorkerLaunch
from unicron.shared.procs import free_port
from unicron.trainer import checkpoint
from unicron.trainer.gpt import make_optimizer
from unicron.trainer.model import build_model
from unicron.trainer.objectstore import RemoteCheckpoints
from unicron.trainer.replica import Replica
from unicron.trainer.resume import fall_back_to_disk
from unicron.trainer.storage import CheckpointStore

from tests.trainer.harness import agent_and_store, make_launch, make_spec, next_generation
from tests.trainer.nodes import assert_same_bits, resumed_from, run_ranks, state_of

moto_server = pytest.importorskip("moto.server")
s3fs = pytest.importorskip("s3fs")


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The variables a worker needs for a fresh bucket on the server: AWS's own, and
    ``UNICRON_CHECKPOINT_URL``; set in this process too."""
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    bucket = f"ck-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    return {**env, "UNICRON_CHECKPOINT_URL": f"s3://{bucket}/checkpoints"}


def objects(env: dict[str, str], job_id: str) -> list[str]:
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    root = env["UNICRON_CHECKPOINT_URL"].removeprefix("s3://") + f"/{job_id}"
    return sorted(str(name).rsplit("/", 1)[-1] for name in fs.ls(root, detail=False))


def save(directory: Path, step: int) -> Path:
    return checkpoint.save(directory, step, {"step": step, "w": torch.full((64,), float(step))})


def test_uploads_are_listed_pruned_and_downloaded_intact(
    s3_env: dict[str, str], tmp_path: Path
) -> None:
    remote = RemoteCheckpoints(s3_env["UNICRON_CHECKPOINT_URL"], "job-u")
    assert remote.steps() == []
    for step in (2, 4, 6, 8):
        remote.upload(step, save(tmp_path / "node", step))
    assert remote.steps() == [4, 6, 8]
    assert objects(s3_env, "job-u") == [f"step-{s}.{x}" for s in (4, 6, 8) for x in ("done", "pt")]

    # A node that kept nothing takes the newest copy into its own directory.
    found = CheckpointStore(tmp_path / "empty", remote).load_newest()
    assert found is not None and found[0] == 8
    assert torch.equal(found[1]["w"], torch.full((64,), 8.0))
    assert [p.name for p in (tmp_path / "empty").iterdir()] == ["step-8.pt"]


def test_a_half_written_upload_is_never_read(s3_env: dict[str, str], tmp_path: Path) -> None:
    url = s3_env["UNICRON_CHECKPOINT_URL"]
    remote = RemoteCheckpoints(url, "job-h")
    remote.upload(4, save(tmp_path / "node", 4))
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    root = url.removeprefix("s3://") + "/job-h"
    # An upload cut short before its marker: data, no marker.
    fs.pipe_file(f"{root}/step-6.pt", save(tmp_path / "node", 6).read_bytes()[:100])
    # A re-upload under way under an old marker: the data no longer matches it.
    remote.upload(8, save(tmp_path / "node", 8))
    fs.pipe_file(f"{root}/step-8.pt", b"the first bytes of a new upload")

    assert remote.steps() == [4, 8]
    assert remote.download(8, tmp_path / "empty") is None
    found = CheckpointStore(tmp_path / "empty", remote).load_newest()
    assert found is not None and found[0] == 4
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == ["step-4.pt"]


def test_a_rank_whose_transfer_failed_takes_the_object_stores_copy(
    s3_env: dict[str, str], tmp_path: Path
) -> None:
    spec = make_spec()
    trained = build_model(spec.model, spec.seed + 1)  # stands for the job's state at step 6
    state = checkpoint.capture(trained, make_optimizer(trained), 6)
    remote = RemoteCheckpoints(s3_env["UNICRON_CHECKPOINT_URL"], "job-f")
    remote.upload(6, checkpoint.save(tmp_path / "old-node", 6, state))

    model = build_model(spec.model, spec.seed)
    joiner = Replica(model, make_optimizer(model), next_step=1, has_state=False)
    # Its node kept nothing and its group is broken: only the object store can serve it.
    assert fall_back_to_disk(joiner, CheckpointStore(tmp_path / "new-node", remote)) == "disk"
    assert joiner.next_step == 7
    for name, tensor in trained.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


@pytest.mark.extended  # the tests above write and read the same objects
def test_a_restart_on_nodes_that_kept_nothing_resumes_from_object_storage(
    s3_env: dict[str, str],
) -> None:
    spec = make_spec(steps=8, checkpoint_every=2)
    with agent_and_store() as (agent, rendezvous, scratch):

        def ranks(steps: int, nodes: str, generation: int) -> list[WorkerLaunch]:
            job = spec.model_copy(update={"steps": steps})
            return [
                next_generation(make_launch(job, rendezvous, agent, scratch / n, r, 2), generation)
                for r, n in enumerate(nodes)
            ]

        run_ranks(agent, ranks(8, "rs", 1))  # the reference: no object store
        expected = state_of(scratch / "r", 8)
        run_ranks(agent, ranks(6, "ab", 2), **s3_env)
        uploaded = RemoteCheckpoints(s3_env["UNICRON_CHECKPOINT_URL"], "job-t").steps()
        # Both nodes are gone: the new ones start with empty directories.
        reports = run_ranks(agent, ranks(8, "cd", 3), **s3_env)
        ends = [state_of(scratch / node, 8) for node in "cd"]

    assert uploaded[-1] == 6
    assert resumed_from(reports) == {6}
    for end in ends:
        assert_same_bits(end, expected)
