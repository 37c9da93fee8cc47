"""Warm spares: a worker process started before it is needed, waiting for its launch.

A fresh Python + torch process needs about 1.7 s before its first step (docs/design.md §5); a
replacement rank taken from a spare skips that. ``python -m unicron.trainer.spare`` imports
torch and the runtime, connects to the agent's local channel at ``UNICRON_AGENT_SOCKET`` and
says hello as a spare — a ``WorkerHello`` with ``job_id=""``, ``generation=-1`` and ``rank=-1``
(the agent tells spares apart by the connection's peer pid, ``SO_PEERCRED``, since it started
them). It then waits for one ``SpareLaunch`` directive
(:mod:`unicron.shared.contracts.workerchannel`), closes that connection and runs the launch's
``script`` — the job's registered trainer module or its own entrypoint — in this process, with
the argv, environment and working directory a fresh process would have had (:func:`run_script`).
A spare belongs to no trainer: what it runs is the launch's, so one spare serves any job. The
worker connects anew and says hello as its rank, and joins as a joiner when
``state_source_rank`` is set. Other lines before the launch are logged and ignored; the agent
closing the connection releases the spare (exit 0).
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import runpy
import socket
import sys
import time

from unicron.shared.contracts.reports import WorkerHello
from unicron.shared.contracts.workerchannel import (
    DirectiveError,
    ScriptLaunch,
    SpareLaunch,
    WorkerEnv,
    env_name,
    parse_directive,
)
from unicron.shared.logging import configure_logging, get_logger
from unicron.trainer.exits import EXIT_BAD_LAUNCH, EXIT_OK, exit_now

log = get_logger(component="unicron.trainer.spare")

SPARE_HELLO = WorkerHello(job_id="", generation=-1, rank=-1)


# Imported ahead only because a launch is most likely to need them (the reference trainer,
# and with it unicron.train and the runtime that every trainer on the API uses); a launch may
# name any module or script, which is imported when it arrives.
WARM_MODULES = ("unicron.trainer.gpt",)


def main() -> int:
    """Warm up, wait for a launch and run it; exit 2 when there is no agent socket or the
    launch is not valid, 0 when the agent released the spare."""
    configure_logging("unicron.trainer.spare")
    try:
        path = WorkerEnv.read().agent_socket
    except ValueError as exc:
        return _bad_launch(str(exc))
    if not path:
        return _bad_launch(f"{env_name('agent_socket')} is not set for a spare")
    warm_up()
    try:
        taken = wait_for_launch(path)
    except (OSError, ValueError) as exc:
        return _bad_launch(f"spare got no valid launch: {exc}")
    if taken is None:
        return EXIT_OK  # released by the agent
    configure_logging(f"trainer.rank{taken.launch.rank}")
    log.info("spare runs its launch", argv=taken.script.argv[1:], job_id=taken.launch.job_id)
    return run_script(taken.script)


def _bad_launch(reason: str) -> int:
    print(f"unicron.trainer.spare: {reason}", file=sys.stderr)
    return EXIT_BAD_LAUNCH


def warm_up() -> None:
    """Import what a worker most likely needs before its first step, so a launch starts at
    once."""
    for module in WARM_MODULES:
        importlib.import_module(module)
    from unicron.trainer.runtime import warm_up as warm_up_runtime

    warm_up_runtime()


def wait_for_launch(path: str, connect_timeout_s: float = 30.0) -> SpareLaunch | None:
    """Say hello as a spare on the agent socket at ``path`` and return the launch it sends;
    None when the agent closes the connection first. Raises ValueError for a bad launch."""
    sock = _connect(path, connect_timeout_s)
    try:
        sock.sendall((SPARE_HELLO.model_dump_json() + "\n").encode())
        with sock.makefile("rb") as stream:
            for line in stream:
                launch = _launch_of(line)
                if launch is not None:
                    return launch
        return None
    finally:
        sock.close()


def _connect(path: str, timeout_s: float) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # the agent is still starting its listener


def _launch_of(line: bytes) -> SpareLaunch | None:
    """The launch on ``line``; None for a line that is not one. Raises ValueError for a
    launch that is not valid: a spare must not wait forever for a launch it was sent."""
    try:
        directive = parse_directive(line)
    except DirectiveError as exc:
        if exc.name == "launch":
            raise ValueError(f"not a valid SpareLaunch: {exc}") from None
        directive = None
    if not isinstance(directive, SpareLaunch):
        log.info("spare ignores a line that is not a launch", line=line[:200])
        return None
    return directive


def run_script(script: ScriptLaunch) -> int:
    """Run the launch's ``python SCRIPT ARGS`` or ``python -m MODULE ARGS`` (the job's entrypoint
    or its trainer's module) in this process as the interpreter would have (``__main__``,
    ``sys.argv``, ``sys.path[0]``, environment, working directory); its exit code. The modules
    the spare loaded (torch, unicron) stay loaded: that is the time a spare saves."""
    os.environ.clear()
    os.environ.update(script.env)
    _fresh_logging()
    if script.cwd is not None:
        os.chdir(script.cwd)
    args = script.argv[1:]
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            path = os.path.abspath(args[0])
            sys.argv = list(args)
            sys.path.insert(0, os.path.dirname(path))
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # unicron.train's hook reports it and exits 1 itself
        code = 1
    else:
        code = 0
    atexit._run_exitfuncs()  # the script's own, and unicron.train's flush of the last reports
    return code


def _fresh_logging() -> None:
    """Undo the spare's own ``logging.basicConfig``: a library that adds its handler only when
    the root logger has none (Lightning) would otherwise print each line twice. The spare's
    own lines go through structlog, which does not use these handlers."""
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)


if __name__ == "__main__":
    exit_now(main())
