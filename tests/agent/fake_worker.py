"""A stand-in for ``trainer.worker`` in the agent's tests: stdlib only, so it starts fast.

It prints its launch JSON (to the log file the agent gave it), connects to the agent's socket,
then acts on ``spec.name``: ``exit-N`` sends ``spec.steps`` StepCompleted lines and exits with
N; ``hang`` sends them and sleeps until killed; ``echo`` sends nothing unasked but reads
directives from the socket, answers each ``{"step": S}`` with a StepCompleted for step S and
``{"exit": N}`` by exiting with N.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any


def step_line(launch: dict[str, Any], step: int) -> bytes:
    report = {
        "kind": "step_completed",
        "node_id": launch["node_id"],
        "job_id": launch["job_id"],
        "generation": launch["generation"],
        "rank": launch["rank"],
        "step": step,
        "loss": 1.0 / (step + 1),
        "iteration_s": 0.01,
    }
    return json.dumps(report).encode() + b"\n"


def echo(sock: socket.socket, launch: dict[str, Any]) -> int:
    for line in sock.makefile("rb"):
        directive = json.loads(line)
        if "exit" in directive:
            return int(directive["exit"])
        sock.sendall(step_line(launch, int(directive["step"])))
    return 0


def main() -> int:
    launch = json.loads(os.environ["UNICRON_WORKER_LAUNCH"])
    print(json.dumps(launch), flush=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(launch["agent_socket"])
    behaviour = launch["spec"]["name"]
    if behaviour == "echo":
        return echo(sock, launch)
    for step in range(min(launch["spec"]["steps"], 100)):
        sock.sendall(step_line(launch, step))
    if behaviour.startswith("exit-"):
        return int(behaviour.removeprefix("exit-"))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
