"""Why a plain script died, from torch's own text: a two-rank gloo run whose tracebacks carry
the ``[rankN]: `` prefix of torch's excepthook, torchelastic's error file as ``@record`` writes
it, and the agent's choice among error file, log and signal."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from unicron.services.agent.errorfile import parse_error, read_error_file
from unicron.services.agent.supervisor import Supervisor
from unicron.services.agent.tracebacks import classify_log
from unicron.shared.contracts.reports import WorkerException, WorkerExited, WorkerStarted
from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.shared.procs import free_port

from tests.agent.conftest import RecordingSink
from tests.agent.test_entrypoints import plain_start, python

MISMATCH = FailureCategory.COLLECTIVE_MISMATCH

# Rank 1 raises (with a cause) after one all-reduce; rank 0's next all-reduce sees it go.
TWO_RANKS = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(2))
        if dist.get_rank() == 1:
            try:
                {}["lr"]
            except KeyError as e:
                raise ValueError("step 5: bad batch shape (4, 7)") from e
        dist.all_reduce(torch.ones(2))

    main()
    """
)


# Rank 0 all-reduces 528 floats while rank 1 all-reduces one: ranks that disagree on a
# collective, as ranks that resumed from different steps do.
MISMATCHED = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(528 if dist.get_rank() == 0 else 1))
    """
)


class Run:
    def __init__(self, tmp: Path, exits: list[int]) -> None:
        self.tmp = tmp
        self.exits = exits  # Popen.returncode of each rank: -N for a signal

    def log(self, rank: int) -> str:
        return (self.tmp / f"r{rank}.log").read_text()

    def error_file(self, rank: int) -> Path:
        return self.tmp / f"r{rank}.error.json"


def run_two_ranks(tmp: Path, script: str) -> Run:
    """Both ranks of ``script`` on gloo, each writing its log and error file in ``tmp``; both
    must fail."""
    (tmp / "two.py").write_text(script)
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "RANK": str(rank), "WORLD_SIZE": "2",
               "TORCHELASTIC_ERROR_FILE": str(tmp / f"r{rank}.error.json")}  # fmt: skip
        with (tmp / f"r{rank}.log").open("wb") as out:
            procs.append(subprocess.Popen([sys.executable, "two.py"], cwd=tmp, env=env,
                                          stdout=out, stderr=subprocess.STDOUT))  # fmt: skip
    exits = [proc.wait(timeout=120) for proc in procs]
    assert all(code != 0 for code in exits), exits
    return Run(tmp, exits)


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_two_ranks(tmp_path_factory.mktemp("gloo"), TWO_RANKS)


def test_torchs_rank_prefix_is_read_through(gloo_run: Run) -> None:
    raised, survived = gloo_run.log(1), gloo_run.log(0)
    assert "[rank1]: ValueError: step 5: bad batch shape (4, 7)" in raised
    failure = classify_log(raised)
    assert failure is not None
    assert (failure.exc_type, failure.category.value) == ("ValueError", "software_other")
    assert failure.message.splitlines() == ["step 5: bad batch shape (4, 7)", "KeyError: 'lr'"]
    peer = classify_log(survived)
    assert peer is not None and survived.startswith("[rank0]: ")
    assert peer.exc_type == "RuntimeError"
    assert peer.category.value in {"connection_reset", "network_other"}, peer


def test_the_death_rattle_after_a_traceback_is_not_part_of_its_message() -> None:
    """Rank 1's log as torch wrote it in one run of the script above: a gloo thread still
    running at exit called std::terminate after the traceback was written, and the interpreter
    added its fatal-error report. The message is the exception's, nothing after it."""
    log = (Path(__file__).parent / "data" / "rank_aborted_after_traceback.log").read_text()
    failure = classify_log(log)
    assert failure is not None and failure.exc_type == "ValueError"
    assert failure.message.splitlines() == ["step 5: bad batch shape (4, 7)", "KeyError: 'lr'"]


def test_a_rank_gloo_aborted_over_a_collective_mismatch_is_named_by_its_cpp_exception(
    tmp_path: Path,
) -> None:
    run = run_two_ranks(tmp_path, MISMATCHED)
    aborted = [rank for rank, code in enumerate(run.exits) if code == -signal.SIGABRT]
    assert aborted, run.exits
    for rank in (0, 1):
        failure = classify_log(run.log(rank))
        assert failure is not None, run.log(rank)
        if rank not in aborted:  # it saw its peer go
            assert failure.category.value in {"connection_reset", "network_other"}, failure
            continue
        assert (failure.exc_type, failure.category) == ("gloo::EnforceNotMet", MISMATCH)
        assert failure.message.startswith("[enforce fail at "), failure
        assert failure.message.endswith("Is there a distributed collective mismatch in your code?")


def test_an_uncaught_cpp_exception_s_message_ends_where_the_death_rattle_goes_on() -> None:
    nccl = (
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage "
        "(run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9\n"
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library."
    )
    log = (
        "step 4 loss 0.93\nterminate called after throwing an instance of 'c10::DistBackendError'"
        f"\n  what():  {nccl}\nFatal Python error: Aborted\n\nThread 0x00007f01 (most recent "
        "call first):\n  <no Python frame>\n"
    )
    failure = classify_log(log)
    assert failure is not None
    assert (failure.exc_type, failure.message) == ("c10::DistBackendError", nccl)
    assert failure.category == MISMATCH


def test_the_error_file_record_wrote_is_read(gloo_run: Run) -> None:
    failure = read_error_file(gloo_run.error_file(1))
    assert failure is not None
    assert (failure.exc_type, failure.category.value) == ("ValueError", "software_other")
    assert failure.message.splitlines() == ["step 5: bad batch shape (4, 7)", "KeyError: 'lr'"]
    # the format some torch versions write: "message" as the plain string
    data = json.loads(gloo_run.error_file(1).read_text())
    plain = parse_error({"message": data["message"]["message"]})
    assert plain is not None
    assert (plain.exc_type, plain.message) == ("ValueError", "step 5: bad batch shape (4, 7)")


def test_an_unreadable_error_file_is_no_failure(tmp_path: Path) -> None:
    assert read_error_file(tmp_path / "missing.json") is None
    (tmp_path / "torn.json").write_text('{"message": {"mess')
    assert read_error_file(tmp_path / "torn.json") is None
    assert parse_error({"message": {"extraInfo": {}}}) is None


RECORDED = (
    "import atexit, sys\n"
    "from torch.distributed.elastic.multiprocessing.errors import record\n"
    "# printed last, after the traceback: the log alone would read as an NCCL error\n"
    "atexit.register(lambda: print('ncclSystemError: NCCL error in: x.cpp:1', file=sys.stderr))\n"
    "@record\n"
    "def main():\n"
    "    raise ValueError('bad batch shape (4, 7)')\n"
    "main()\n"
)


async def test_the_error_file_comes_before_the_log(
    supervisor: Supervisor, sink: RecordingSink
) -> None:
    cmd, ctx = plain_start("job-r", python(RECORDED))
    await supervisor.start_worker(cmd, ctx)
    report = await sink.next(WorkerException, within=30)
    assert (report.exc_type, report.category) == ("ValueError", "software_other")
    assert report.message == "bad batch shape (4, 7)"
    assert supervisor.error_path(cmd.key).is_file()
    assert "ncclSystemError" in supervisor.log_path(cmd.key).read_text()


ABORTS = (
    "import os, traceback\n"
    "try:\n    raise ValueError('bad batch shape (4, 7)')\n"
    "except ValueError:\n    traceback.print_exc()\n"
)


@pytest.mark.parametrize(
    ("code", "signal", "reported"),
    [
        (ABORTS + "os.abort()\n", 6, "ValueError"),  # an exception, then an abort in teardown
        (ABORTS + "import signal\nos.kill(os.getpid(), signal.SIGKILL)\n", 9, None),
    ],
)
async def test_a_signal_from_outside_reads_nothing_in_the_log(
    supervisor: Supervisor, sink: RecordingSink, code: str, signal: int, reported: str | None
) -> None:
    await supervisor.start_worker(*plain_start("job-s", python(code)))
    await sink.next(WorkerStarted)
    reports = [await asyncio.wait_for(sink.reports.get(), 15)]
    while not isinstance(reports[-1], WorkerExited):
        reports.append(await asyncio.wait_for(sink.reports.get(), 15))
    assert reports[-1].signal == signal
    told = [r.exc_type for r in reports if isinstance(r, WorkerException)]
    assert told == ([reported] if reported else [])
