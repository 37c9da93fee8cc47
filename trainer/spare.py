"""Warm spares: a worker process started before it is needed, waiting for its launch.

A fresh Python + torch process needs about 1.7 s before its first step (DESIGN.md §5); a
replacement rank taken from a spare skips that. ``python -m trainer.worker --spare`` (or
``UNICRON_WORKER_SPARE=1``) imports torch and the runtime, connects to the agent's local
channel at ``UNICRON_AGENT_SOCKET`` and says hello as a spare — a ``WorkerHello`` with
``job_id=""``, ``generation=-1`` and ``rank=-1`` (the agent tells spares apart by the
connection's peer pid, ``SO_PEERCRED``, since it started them). It then waits for one line::

    {"directive": "launch", "launch": <WorkerLaunch JSON>}

closes that connection and runs exactly as a worker started with that launch: it connects
anew and says hello as its rank, and joins as a joiner when ``state_source_rank`` is set.
Other lines before the launch are logged and ignored; the agent closing the connection
releases the spare (exit 0).
"""

from __future__ import annotations

import json
import socket
import time

from pydantic import ValidationError

from unicron.shared.logging import get_logger
from unicron.shared.messages import WorkerLaunch
from unicron.shared.reports import WorkerHello

log = get_logger(component="trainer.spare")

SPARE_ENV = "UNICRON_WORKER_SPARE"
AGENT_SOCKET_ENV = "UNICRON_AGENT_SOCKET"
SPARE_HELLO = WorkerHello(job_id="", generation=-1, rank=-1)


def warm_up() -> None:
    """Import what every worker needs before its first step, so a launch starts at once."""
    import torch

    import unicron.trainer.runtime  # noqa: F401

    # The first optimizer imports most of torch's compiler stack (~800 modules, seconds);
    # one step on a throwaway scalar does that now instead of after the launch.
    scalar = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.AdamW([scalar])
    torch.autograd.backward(scalar.sum())
    optimizer.step()


def wait_for_launch(path: str, connect_timeout_s: float = 30.0) -> WorkerLaunch | None:
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


def _launch_of(line: bytes) -> WorkerLaunch | None:
    try:
        message = json.loads(line)
    except ValueError:
        message = None
    if not isinstance(message, dict) or message.get("directive") != "launch":
        log.info("spare ignores a line that is not a launch", line=line[:200])
        return None
    try:
        return WorkerLaunch.model_validate(message.get("launch"))
    except ValidationError as exc:
        raise ValueError(f"not a valid WorkerLaunch: {exc}") from None
