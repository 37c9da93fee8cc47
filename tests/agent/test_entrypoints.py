"""A job's own entrypoint on one agent: torchrun's environment, failures read from the log,
commands that cannot run, no hang alarms for scripts that never step, safe package unpacking."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest
from unicron.services.agent.launch import JobContext
from unicron.services.agent.packages import unpack
from unicron.services.agent.supervisor import Supervisor
from unicron.services.agent.tracebacks import classify_log
from unicron.shared.bus.packages import PackageError
from unicron.shared.contracts.messages import Rendezvous, StartWorker
from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.reports import WorkerException, WorkerExited, WorkerStarted

from tests.agent.conftest import RecordingSink

NCCL_TEXT = (
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), "
    "NCCL version 2.19.3\nncclSystemError: System call (e.g. socket, malloc) or external library "
    "call failed or device error."
)


def plain_start(
    job_id: str, argv: list[str], cwd: Path | None = None, rank: int = 0, **env: str
) -> tuple[StartWorker, JobContext]:
    cmd = StartWorker(
        job_id=job_id,
        generation=2,
        rank=rank,
        world_size=4,
        rendezvous=Rendezvous(host="127.0.0.1", port=29500, prefix=f"{job_id}/g2/"),
        local_rank=1,
        local_world_size=2,
        group_rank=1,
    )
    spec = JobSpec(name=job_id, entrypoint=argv, env=env)
    checkpoints = Path(f"/tmp/ckpt/{job_id}")
    return cmd, JobContext(spec, checkpoints, restarts=3, cwd=cwd, master=("10.0.0.7", 4242))


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def test_an_entrypoint_runs_in_its_dir_with_torchruns_environment(
    supervisor: Supervisor, sink: RecordingSink, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    dump = "import json, os; json.dump({**os.environ, 'CWD': os.getcwd()}, open('env.json', 'w'))"
    await supervisor.start_worker(*plain_start("job-e", python(dump), workdir, rank=3, LR="0.5"))
    assert (await sink.next(WorkerExited)).exit_code == 0
    env = json.loads((workdir / "env.json").read_text())
    expected = {
        "CWD": str(workdir),
        "LR": "0.5",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "ROLE_RANK": "3",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "4242",
        "TORCHELASTIC_RESTART_COUNT": "3",
        "TORCHELASTIC_RUN_ID": "job-e",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "UNICRON_JOB_ID": "job-e",
        "UNICRON_CHECKPOINT_DIR": "/tmp/ckpt/job-e",
        "UNICRON_AGENT_SOCKET": str(supervisor.socket_path),
        "OMP_NUM_THREADS": "1",  # two ranks share the node, as torchrun would set it
    }
    assert {k: env.get(k) for k in expected} == expected
    assert json.loads(env["UNICRON_WORKER_LAUNCH"])["rank"] == 3


async def test_a_job_s_own_omp_num_threads_is_kept(
    supervisor: Supervisor, sink: RecordingSink, tmp_path: Path
) -> None:
    dump = "import os; open('omp', 'w').write(os.environ['OMP_NUM_THREADS'])"
    start = plain_start("job-o", python(dump), tmp_path, OMP_NUM_THREADS="4")
    await supervisor.start_worker(*start)
    assert (await sink.next(WorkerExited)).exit_code == 0
    assert (tmp_path / "omp").read_text() == "4"


async def test_an_nccl_error_written_to_stderr_is_classified(
    supervisor: Supervisor, sink: RecordingSink
) -> None:
    code = f"import sys; print('step 1'); print({NCCL_TEXT!r}, file=sys.stderr); sys.exit(1)"
    await supervisor.start_worker(*plain_start("job-n", python(code)))
    started = await sink.next(WorkerStarted)
    exception = await sink.next(WorkerException)
    assert (exception.pid, exception.category, exception.exc_type) == (
        started.pid,
        "nccl_error",
        "DistBackendError",
    )
    assert "ncclSystemError" in exception.message
    assert (await sink.next(WorkerExited)).exit_code == 1


async def test_a_traceback_is_reported_with_its_chain_before_the_exit(
    supervisor: Supervisor, sink: RecordingSink
) -> None:
    code = (
        "try:\n    {}['lr']\nexcept KeyError as e:\n    raise ValueError('boom at step 5') from e\n"
    )
    await supervisor.start_worker(*plain_start("job-v", python(code)))
    report = await sink.next(WorkerException, within=15)
    assert (report.exc_type, report.category) == ("ValueError", "software_other")
    assert report.message.splitlines() == ["boom at step 5", "KeyError: 'lr'"]
    assert not report.launch_failed


@pytest.mark.parametrize(
    ("argv", "workdir", "code", "named"),
    [
        (["/no/such/program", "x"], None, 127, "command '/no/such/program'"),
        ([sys.executable, "-c", "pass"], "/no/such/dir", 127, "working directory '/no/such/dir'"),
        (["/etc/hostname"], None, 126, "command '/etc/hostname'"),
    ],
)
async def test_a_command_that_cannot_run_is_a_launch_failure(
    supervisor: Supervisor,
    sink: RecordingSink,
    argv: list[str],
    workdir: str | None,
    code: int,
    named: str,
) -> None:
    cwd = Path(workdir) if workdir else None
    await supervisor.start_worker(*plain_start("job-x", argv, cwd))
    failure = await sink.next(WorkerException)
    assert failure.launch_failed and named in failure.message
    assert (await sink.next(WorkerExited)).exit_code == code
    assert supervisor.live() == [] and supervisor.slots.free() == 0


async def test_a_script_that_never_steps_is_not_hung(
    supervisor: Supervisor, sink: RecordingSink, watch: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from unicron.services.agent.hang import HangWatch

    assert isinstance(watch, HangWatch)
    monkeypatch.setattr(watch.settings, "hang_startup_s", 0.2)
    await supervisor.start_worker(*plain_start("job-q", python("import time; time.sleep(30)")))
    await sink.next(WorkerStarted)
    await asyncio.sleep(1.0)
    assert watch.check() == []
    assert [r for r in list(sink.reports._queue) if r.kind == "worker_hung"] == []


def tar_gz(members: list[tarfile.TarInfo], payload: bytes = b"x") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(payload) if info.isfile() else None)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    "evil",
    [
        member("/etc/evil"),
        member("../evil"),
        member("a/../../evil"),
        member("link", tarfile.SYMTYPE, "/etc/passwd"),
        member("link", tarfile.SYMTYPE, "../../outside"),
    ],
)
def test_unpacking_refuses_what_escapes_and_leaves_nothing(
    tmp_path: Path, evil: tarfile.TarInfo
) -> None:
    target = tmp_path / "workdirs" / "job-a"
    with pytest.raises(PackageError):
        unpack(tar_gz([member("ok.py"), evil]), target)
    assert not target.exists()
    assert list((tmp_path / "workdirs").iterdir()) == []  # no temporary directory left


def test_unpacking_is_whole(tmp_path: Path) -> None:
    target = tmp_path / "job-a"
    unpack(
        tar_gz([member("pkg/train.py"), member("pkg/link", tarfile.SYMTYPE, "train.py")]), target
    )
    assert (target / "pkg" / "train.py").read_bytes() == b"x"
    assert (target / "pkg" / "link").resolve() == (target / "pkg" / "train.py").resolve()


def test_log_classification_needs_something_recognisable() -> None:
    assert classify_log("epoch 1\nexiting with code 3\n") is None
    gloo = classify_log("[pair.cc:534] Connection closed by peer [127.0.0.1]:5555\n")
    assert gloo is not None and gloo.category.value == "connection_reset"
