"""A plain script's checkpoint directory follows its job: snapshots taken on one node restore on
another, through the bus's object store (a real nats-server) or object storage at a URL; the
newest copy wins, and a torn, tampered or half-written copy never lands."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from unicron.services.agent.api import SnapshotStore
from unicron.services.agent.mirror import CheckpointMirror, scan
from unicron.services.agent.snapshots import UrlSnapshots
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.identity import WorkerKey

JOB = "job-ckpt"
LONG_AGO_NS = 1_700_000_000 * 10**9  # written well before the quiet period


@pytest.fixture(params=["bus", "url"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> SnapshotStore:
    if request.param == "bus":
        bus: Bus = request.getfixturevalue("bus")
        return bus.checkpoint_objects()
    return UrlSnapshots(f"file://{tmp_path / 'bucket'}")


@dataclass
class Running:
    """A worker as the mirror looks at it: a launch key, who it is now, whether it is a script."""

    key: WorkerKey
    plain: bool = True

    @property
    def current(self) -> WorkerKey:
        return self.key


def node(store: SnapshotStore, tmp_path: Path, name: str, **kw: Any) -> CheckpointMirror:
    async def over(_job: str) -> bool:
        return bool(kw.get("over", False))

    live: Callable[[], list[Any]] = kw.get("live", list)
    return CheckpointMirror(
        store, tmp_path / name / "checkpoints", name, live, over, 5.0, kw.get("max_bytes")
    )


def write(mirror: CheckpointMirror, files: dict[str, bytes], mtime_ns: int = LONG_AGO_NS) -> Path:
    directory = mirror.checkpoints / JOB
    for name, data in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return directory


def contents(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name, _size, _mtime in scan(directory)}


LIGHTNING = {"last.ckpt": b"weights at step 40", "epoch=0-step=40.ckpt": b"weights at step 40"}


async def test_a_snapshot_taken_on_one_node_restores_on_another(
    store: SnapshotStore, tmp_path: Path
) -> None:
    a, b = node(store, tmp_path, "a"), node(store, tmp_path, "b")
    written = write(a, {**LIGHTNING, "checkpoint-40/trainer_state.json": b'{"step": 40}'})
    sent = await a.snapshot(JOB, generation=1)
    assert sent is not None and sent.files == 3
    restored = await b.restore(JOB)
    assert restored == sent
    here = b.checkpoints / JOB
    assert contents(here) == contents(written)
    assert scan(here) == scan(written)  # mtimes kept: a later comparison sees the same writes
    assert await b.snapshot(JOB, generation=2) is None  # nothing new to send back


async def test_the_directory_a_node_wrote_last_is_kept_over_an_older_snapshot(
    store: SnapshotStore, tmp_path: Path
) -> None:
    """Rank 0 stayed here and wrote again after the last snapshot (then crashed): the restart
    on this node keeps its own newer files."""
    a = node(store, tmp_path, "a")
    write(a, {"ckpt.pt": b"step 10"})
    await a.snapshot(JOB, generation=1)
    directory = write(a, {"ckpt.pt": b"step 20"}, mtime_ns=LONG_AGO_NS + 10**9)
    assert await a.restore(JOB) is None
    assert contents(directory) == {"ckpt.pt": b"step 20"}


async def test_a_later_generation_s_snapshot_wins_and_replaces_the_whole_directory(
    store: SnapshotStore, tmp_path: Path
) -> None:
    a, b = node(store, tmp_path, "a"), node(store, tmp_path, "b")
    write(a, {"old.pt": b"generation 1", "ckpt.pt": b"step 10"})
    await a.snapshot(JOB, generation=1)
    await b.restore(JOB)
    write(b, {"ckpt.pt": b"step 30"}, mtime_ns=LONG_AGO_NS + 5 * 10**9)
    (b.checkpoints / JOB / "old.pt").unlink()  # the script rotated it away
    await b.snapshot(JOB, generation=2)
    # a, back after a cut link, still holds generation 1's directory: it must not win
    assert await a.snapshot(JOB, generation=1, final=True) is None
    assert await a.restore(JOB) is not None
    assert contents(a.checkpoints / JOB) == {"ckpt.pt": b"step 30"}


async def test_a_directory_being_written_is_sent_once_it_is_still(
    store: SnapshotStore, tmp_path: Path
) -> None:
    a = node(store, tmp_path, "a")
    write(a, {"ckpt.pt": b"half of it"}, mtime_ns=time.time_ns())
    assert await a.snapshot(JOB, generation=1) is None
    assert await a.newest(JOB) is None
    # the script is gone: nothing can be writing any more
    assert await a.snapshot(JOB, generation=1, final=True) is not None


async def test_a_tampered_snapshot_is_not_restored(store: SnapshotStore, tmp_path: Path) -> None:
    a, b = node(store, tmp_path, "a"), node(store, tmp_path, "b")
    write(a, {"ckpt.pt": b"step 10"})
    sent = await a.snapshot(JOB, generation=1)
    assert sent is not None
    mine = write(b, {"ckpt.pt": b"what b had"})
    await store.put_bytes(sent.blob, b"not the tar the manifest names")
    with capture_logs() as logs:
        assert await b.restore(JOB) is None
    assert contents(mine) == {"ckpt.pt": b"what b had"}
    assert any("does not match its manifest" in str(e.get("error")) for e in logs), logs


async def test_the_bus_refuses_a_snapshot_over_its_limit_and_says_what_to_set(
    bus: Bus, tmp_path: Path
) -> None:
    a = node(bus.checkpoint_objects(), tmp_path, "a", max_bytes=4096)
    write(a, {"model.pt": os.urandom(64 * 1024)})
    with capture_logs() as logs:
        assert await a.snapshot(JOB, generation=1) is None
    assert await a.newest(JOB) is None
    assert any("UNICRON_CHECKPOINT_URL" in e["event"] for e in logs), logs


async def test_rank_0_s_directory_is_followed_while_it_runs_and_dropped_when_the_job_ends(
    store: SnapshotStore, tmp_path: Path
) -> None:
    workers = [Running(WorkerKey(JOB, 3, 0)), Running(WorkerKey("other", 1, 1))]
    a = node(store, tmp_path, "a", live=lambda: list(workers), over=True)
    write(a, {"ckpt.pt": b"step 10"})
    await a.tick()
    sent = await a.newest(JOB)
    assert sent is not None and (sent.generation, sent.node_id) == (3, "a")
    write(a, {"ckpt.pt": b"step 11"}, mtime_ns=time.time_ns())  # its last write, then it exits
    workers.clear()
    await a.tick()  # the final snapshot, then the job is over: nothing is left behind
    assert await a.newest(JOB) is None
    assert await store.get_bytes(sent.blob) is None
