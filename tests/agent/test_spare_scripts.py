"""Warm spares serve any job's trainer: a real spare (torch and unicron already loaded) runs the
module the node registered for the job's trainer, or the user's ``python SCRIPT`` or
``python -m MODULE``, in its own process, with the argv, environment and working directory a
fresh process would have had. A spare is tied to no trainer: the launch names what it runs."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from unicron.services.agent.channel import WorkerChannel
from unicron.services.agent.launch import JobContext, spare_can_run
from unicron.services.agent.spares import SparePool
from unicron.services.agent.supervisor import Supervisor
from unicron.shared.contracts.messages import StartWorker
from unicron.shared.contracts.reports import StepCompleted, WorkerExited, WorkerStarted

from tests.agent.conftest import RecordingSink, Start, spare_pool, start_cmd, until

REAL_SPARE = [sys.executable, "-m", "unicron.trainer.spare"]
TOY_TRAINER = "tests.agent.toy_trainer"  # not the built-in GPT

SCRIPT = textwrap.dedent(
    """
    import json, logging, os, sys
    if sys.argv[1:] == ["--fail"]:
        raise ValueError("the script's own bug")
    root = logging.getLogger()
    json.dump({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
               "name": __name__, "rank": os.environ["RANK"], "mine": os.environ["MINE"],
               "spare": os.environ.get("UNICRON_WORKER_SPARE"),
               "logging": [len(root.handlers), root.level]}, open("ran.json", "w"))
    """
)


@pytest.fixture
async def real_spares(
    supervisor: Supervisor, channel: WorkerChannel, tmp_path: Path
) -> AsyncIterator[SparePool]:
    async with spare_pool(REAL_SPARE, supervisor, channel, tmp_path) as pool:
        yield pool


def script_start(workdir: Path, *args: str) -> tuple[StartWorker, JobContext]:
    cmd, ctx = start_cmd(
        "job-u", "user", entrypoint=["python", "train.py", *args], env={"MINE": "1"}
    )
    return cmd, JobContext(ctx.spec, ctx.checkpoint_dir, 0, workdir, ("127.0.0.1", 29511))


async def test_a_spare_runs_the_job_s_own_script_as_a_fresh_process_would(
    supervisor: Supervisor, real_spares: SparePool, sink: RecordingSink, tmp_path: Path
) -> None:
    workdir = tmp_path / "code"
    workdir.mkdir()
    (workdir / "train.py").write_text(SCRIPT)
    await until(lambda: len(real_spares.ready()) == 1, within=60)
    spare = real_spares.ready()[0]
    cmd, ctx = script_start(workdir, "--lr", "0.1")
    await supervisor.start_worker(cmd, ctx)
    started = await sink.next(WorkerStarted)
    assert started.pid == spare.proc.pid and real_spares.served == 1
    exited = await sink.next(WorkerExited, within=30)
    assert exited.exit_code == 0, (tmp_path / "logs" / "job-u" / "g1-r0.log").read_text()
    ran = json.loads((workdir / "ran.json").read_text())
    assert ran["argv"] == [str(workdir / "train.py"), "--lr", "0.1"]
    assert (ran["cwd"], ran["path0"], ran["name"]) == (str(workdir), str(workdir), "__main__")
    assert (ran["rank"], ran["mine"], ran["spare"]) == ("0", "1", None)
    assert ran["logging"] == [0, logging.WARNING]  # no handler of the spare's own


async def test_a_script_that_raises_in_a_spare_exits_1_with_its_traceback(
    supervisor: Supervisor, real_spares: SparePool, sink: RecordingSink, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    await until(lambda: len(real_spares.ready()) == 1, within=60)
    cmd, ctx = script_start(tmp_path, "--fail")
    await supervisor.start_worker(cmd, ctx)
    exited = await sink.next(WorkerExited, within=30)
    assert exited.exit_code == 1
    log = (tmp_path / "logs" / "job-u" / "g1-r0.log").read_text()
    assert "ValueError: the script's own bug" in log


RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, time
    json.dump({"devices": os.environ.get("CUDA_VISIBLE_DEVICES")},
              open(f"rank{os.environ['RANK']}.json", "w"))
    deadline = time.monotonic() + 30
    while not os.path.exists("go") and time.monotonic() < deadline:  # hold the slot till told
        time.sleep(0.01)
    """
)


async def test_every_rank_of_a_script_starts_warm_on_its_slot_s_device(
    supervisor: Supervisor, channel: WorkerChannel, sink: RecordingSink, tmp_path: Path
) -> None:
    """A spare per slot, none holding a device while it waits: a restarted plain-script
    generation takes one for each rank, and each gets its slot's device with the launch."""
    supervisor.slots.use(["3", "5"])  # two GPUs, as far as the slots know
    (tmp_path / "train.py").write_text(RANK_SCRIPT)
    async with spare_pool(REAL_SPARE, supervisor, channel, tmp_path, count=2) as pool:
        await until(lambda: len(pool.ready()) == 2, within=120)
        assert supervisor.slots.free() == 2  # warm interpreters hold no device
        for rank in (0, 1):
            cmd, ctx = start_cmd("job-u", "user", rank=rank, entrypoint=["python", "train.py"])
            ctx = JobContext(ctx.spec, ctx.checkpoint_dir, 0, tmp_path, ("127.0.0.1", 29511))
            await supervisor.start_worker(cmd, ctx)
        assert pool.served == 2 and all(w.spare for w in supervisor.live())
        assert supervisor.slots.free() == 0
        (tmp_path / "go").touch()
        for _ in range(2):
            assert (await sink.next(WorkerExited, within=30)).exit_code == 0
    ran = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert sorted(r["devices"] for r in ran) == ["3", "5"]
    assert supervisor.slots.free() == 2


def toy_start(tmp_path: Path, registered: bool) -> Start:
    """A job on the toy trainer: the module this node registered for the job's trainer, or the
    job's own ``python -m`` entrypoint."""
    env = {"TOY_LOSS": "0.25"}
    if registered:
        return start_cmd("job-toy", "toy", steps=3, env=env)
    cmd, ctx = start_cmd(
        "job-toy", "toy", steps=3, env=env, entrypoint=["python", "-m", TOY_TRAINER]
    )
    return Start(cmd, JobContext(ctx.spec, ctx.checkpoint_dir, 0, tmp_path, ("127.0.0.1", 29511)))


@pytest.mark.parametrize("registered", [True, False], ids=["registered", "entrypoint"])
async def test_a_spare_takes_over_a_rank_running_the_job_s_trainer_not_the_built_in_gpt(
    supervisor: Supervisor, real_spares: SparePool, sink: RecordingSink, tmp_path: Path,
    registered: bool,
) -> None:  # fmt: skip
    supervisor.registry.register("gpt", TOY_TRAINER)  # this node runs its own trainer
    await until(lambda: len(real_spares.ready()) == 1, within=60)
    spare = real_spares.ready()[0]
    cmd, ctx = toy_start(tmp_path, registered)
    await supervisor.start_worker(cmd, ctx)
    started = await sink.next(WorkerStarted)
    assert started.pid == spare.proc.pid and real_spares.served == 1
    # the toy's steps, with the loss the job's env gave it: the GPT would report other losses
    reports = await sink.gather(*[StepCompleted] * 3, WorkerExited, within=30)
    log = (tmp_path / "logs" / "job-toy" / "g1-r0.log").read_text()
    steps = [r for r in reports if isinstance(r, StepCompleted)]
    assert [(s.job_id, s.rank, s.step, s.loss) for s in steps] == [
        ("job-toy", 0, step, 0.25) for step in range(3)
    ], log
    [exited] = [r for r in reports if isinstance(r, WorkerExited)]
    assert (exited.pid, exited.exit_code) == (spare.proc.pid, 0), log


def test_spares_run_python_scripts_and_modules_only() -> None:
    python = sys.executable
    assert spare_can_run([python, "train.py", "--x"])
    assert spare_can_run([python, "-m", "pkg.train"])
    assert spare_can_run([python, "-m", "unicron.trainer.worker"])  # the reference trainer
    assert not spare_can_run([python, "-O", "train.py"])  # a flag changes the process
    assert not spare_can_run(["bash", "run.sh"])
    assert not spare_can_run([python, "-m"])
