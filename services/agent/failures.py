"""What the agent reports for a worker that failed without saying why.

A plain script reports nothing in-band: when it exits non-zero the agent reads the exception
it recorded in torchelastic's error file (:mod:`unicron.services.agent.errorfile`) or, without
one, its log's tail (:mod:`unicron.services.agent.tracebacks`), and reports it as a
``WorkerException``. A worker killed from outside (SIGKILL: the OOM killer, an operator) wrote
nothing about it, so nothing is read: its exit names the signal. A command that cannot be
executed at all (a missing program or working directory, no permission) never becomes a
process: it is reported as a launch failure, which ends the job at once, since restarting it
would fail the same way. A start that finds no free GPU on the node is a launch failure too, but
one a restart may cure.
"""

from __future__ import annotations

import errno
from pathlib import Path

from unicron.services.agent.errorfile import read_error_file
from unicron.services.agent.tracebacks import classify_log, read_tail
from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.messages import StartWorker
from unicron.shared.contracts.reports import WorkerException, WorkerExited
from unicron.shared.contracts.taxonomy import CODE_SIGNALS, FailureCategory

# exec errors of a command that can never run here, with the exit code a shell would give
_EXIT_CODES = {errno.ENOENT: 127, errno.ENOTDIR: 127, errno.EACCES: 126, errno.ENOEXEC: 126}


def cannot_execute(exc: OSError) -> bool:
    return exc.errno in _EXIT_CODES


def exec_error(argv: list[str], cwd: Path | None, exc: OSError) -> str:
    """A reason that names what could not be executed: the command or the directory."""
    if cwd is not None and (exc.filename == str(cwd) or not cwd.is_dir()):
        what = f"working directory {str(cwd)!r}"
    else:
        what = f"command {argv[0]!r}"
    return f"cannot execute {what}: {exc.strerror or exc}"


def launch_failure(
    node_id: str, cmd: StartWorker, argv: list[str], cwd: Path | None, exc: OSError
) -> list[WorkerException | WorkerExited]:
    """The reports of a worker that could not be started: its exception, then its exit."""
    return launch_failure_reports(
        node_id, cmd, type(exc).__name__, exec_error(argv, cwd, exc), exc.errno
    )


def launch_failure_reports(
    node_id: str, cmd: StartWorker, exc_type: str, message: str, code: int | None = None
) -> list[WorkerException | WorkerExited]:
    ids = {"node_id": node_id, **cmd.key._asdict()}
    category = FailureCategory.SOFTWARE_OTHER.value
    exit_code = _EXIT_CODES.get(code or 0, 127)
    return [
        WorkerException(**ids, pid=0, exc_type=exc_type, message=message,
                        category=category, launch_failed=True),
        WorkerExited(**ids, pid=0, exit_code=exit_code),
    ]  # fmt: skip


def no_free_gpu(
    node_id: str, cmd: StartWorker, gpus: str, holders: list[WorkerKey]
) -> list[WorkerException | WorkerExited]:
    """The reports of a start refused because every GPU slot of the node is held (``gpus`` says
    how many, ``holders`` are the workers on them). A failed launch of this rank, but neither the
    job's own code nor for good (a holder may be a worker still being stopped): the job recovers
    from it as from a rank that exited abnormally, within its recoveries, not failing at once."""
    held = ", ".join(f"job {k.job_id} rank {k.rank} (generation {k.generation})" for k in holders)
    message = f"no free GPU on node {node_id}: {gpus}, all held by {held or 'starts under way'}"
    ids = {"node_id": node_id, **cmd.key._asdict()}
    category = FailureCategory.EXITED_ABNORMALLY.value
    return [
        WorkerException(**ids, pid=0, exc_type="NoFreeGPUError", message=message,
                        category=category),
        WorkerExited(**ids, pid=0, exit_code=1),
    ]  # fmt: skip


def exit_exception(
    node_id: str, who: WorkerKey, pid: int, files: tuple[Path, Path], signum: int | None
) -> WorkerException | None:
    """The exception a dead worker recorded in its error file, or else the one its log ends
    with, as its report; None when they tell of none, or when a signal from outside killed it.
    ``files`` is (log, error file)."""
    if signum is not None and signum not in CODE_SIGNALS:
        return None
    log, error_file = files
    failure = read_error_file(error_file) or classify_log(read_tail(log))
    if failure is None:
        return None
    return WorkerException(
        node_id=node_id,
        **who._asdict(),
        pid=pid,
        exc_type=failure.exc_type or "error",
        message=failure.message,
        category=failure.category.value,
    )
