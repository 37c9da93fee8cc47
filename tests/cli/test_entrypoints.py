"""``unicron submit --working-dir`` and how the CLI shows a script's failure."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from unicron.cli import packages
from unicron.cli.render import event_line
from unicron.shared.contracts.events import CloudEvent, FailureDetected
from unicron.shared.contracts.models import FailureRecord, Job, JobSpec, JobState
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind, RecoveryAction, Severity
from unicron.shared.store.state import StateStore

from tests.cli.test_cli import unicron


def code_dir(tmp_path: Path) -> Path:
    """A directory of its own: tmp_path also holds the test servers' data."""
    code = tmp_path / "code"
    code.mkdir()
    return code


async def test_working_dir_is_uploaded_and_named_as_a_package(
    api_url: str, state: StateStore, tmp_path: Path
) -> None:
    tmp_path = code_dir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"junk")
    args = ("submit", "--name", "mine", "--entrypoint", "python -u train.py --lr 0.1")
    result = await unicron(*args, "--working-dir", str(tmp_path), api_url=api_url)
    assert result.exit_code == 0, result.output
    [job] = await state.list_jobs()
    assert job.spec.entrypoint == ["python", "-u", "train.py", "--lr", "0.1"]
    assert job.spec.package is not None and job.spec.working_dir == f"pkg://{job.spec.package}"
    with tarfile.open(fileobj=io.BytesIO(packages.pack(tmp_path))) as tar:
        assert tar.getnames() == ["train.py"]


async def test_a_missing_script_is_refused_before_anything_is_sent(
    api_url: str, state: StateStore, tmp_path: Path
) -> None:
    tmp_path = code_dir(tmp_path)
    (tmp_path / "other.py").write_text("")
    args = ("submit", "--name", "mine", "--entrypoint", "python train.py")
    result = await unicron(*args, "--working-dir", str(tmp_path), api_url=api_url)
    assert result.exit_code == 2
    assert "'train.py', which is not a file in" in result.output
    assert await state.list_jobs() == []


async def test_a_working_dir_over_the_limit_is_refused(
    api_url: str, state: StateStore, tmp_path: Path
) -> None:
    tmp_path = code_dir(tmp_path)
    (tmp_path / "train.py").write_text("")
    with (tmp_path / "data.bin").open("wb") as sparse:  # 101 MiB that take no disk
        sparse.truncate(101 * 1024 * 1024)
    args = ("submit", "--name", "mine", "--entrypoint", "python train.py")
    result = await unicron(*args, "--working-dir", str(tmp_path), api_url=api_url)
    assert result.exit_code == 2
    assert "more than 100 MiB" in result.output
    assert await state.list_jobs() == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
async def test_an_unreadable_working_dir_is_refused(
    api_url: str, state: StateStore, tmp_path: Path
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0)
    args = ("submit", "--name", "mine", "--entrypoint", "python -m pkg")
    result = await unicron(*args, "--working-dir", str(locked), api_url=api_url)
    assert result.exit_code == 2 and "cannot read working dir" in result.output
    assert await state.list_jobs() == []


async def test_a_missing_working_dir_is_refused(api_url: str, tmp_path: Path) -> None:
    args = ("submit", "--name", "mine", "--entrypoint", "python train.py")
    result = await unicron(*args, "--working-dir", str(tmp_path / "nope"), api_url=api_url)
    assert result.exit_code == 2 and "is not a directory" in result.output


def test_the_script_of_an_entrypoint() -> None:
    assert packages.script_of(["python3.11", "-u", "train.py"]) == "train.py"
    assert packages.script_of(["bash", "run.sh"]) == "run.sh"
    assert packages.script_of(["./run.sh"]) == "./run.sh"
    assert packages.script_of(["python", "-m", "pkg.train"]) is None
    assert packages.script_of(["torchrun", "x.py"]) is None


async def test_status_and_events_show_the_failure(api_url: str, state: StateStore) -> None:
    failure = FailureRecord(
        failure_id="f1", generation=2, kind="exception", category="software_other",
        severity="SEV2", action="restart", rank=1, node_id="n0", observed_at=1.0,
        exc_type="ValueError", message="boom at step 5\nKeyError: 'lr'", at=1.0,
    )  # fmt: skip
    job = Job(
        id="job-1", name="mine", spec=JobSpec(name="mine", entrypoint=["python", "t.py"]),
        state=JobState.FAILED, last_failure=failure,
    )  # fmt: skip
    await state.create_job(job)
    detail = await unicron("status", "job-1", api_url=api_url)
    assert detail.exit_code == 0
    assert "python t.py" in detail.stdout
    assert "exception: software_other (SEV2, restart) on rank 1 @ n0" in detail.stdout
    assert "ValueError: boom at step 5" in detail.stdout

    event = FailureDetected(
        failure_id="f1", job_id="job-1", node_id="n0", rank=1, generation=2,
        kind=FailureKind.EXCEPTION, category=FailureCategory.SOFTWARE_OTHER,
        severity=Severity.SEV2, action=RecoveryAction.RESTART, observed_at=1.0,
        exc_type="ValueError", message="boom at step 5\nKeyError: 'lr'",
    )  # fmt: skip
    line = event_line(7, CloudEvent.wrap(event, "test")).plain
    assert "\n" not in line
    assert "exc_type=ValueError" in line and 'message="boom at step 5\\nKeyError:' in line
