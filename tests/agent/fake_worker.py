"""A stand-in for ``trainer.worker`` in the agent's tests: stdlib only, so it starts fast.

It prints its launch JSON and then ``{"cuda_visible_devices": ...}`` (to the log file the agent
gave it), connects to the agent's socket (``mute`` never does: it only sleeps until killed),
then acts on ``spec.name``:

- ``exit-N`` sends ``spec.steps`` StepCompleted lines and exits with N;
- ``hang`` sends them and sleeps until killed;
- ``echo`` sends nothing unasked but reads directives from the socket, answers each
  ``{"step": S}`` with a StepCompleted for step S and ``{"exit": N}`` by exiting with N;
- ``step-LO-HI-SPIKE-CKPT`` (milliseconds) steps like a trainer: a ``compute`` phase of LO to HI
  ms (SPIKE ms once in 25 steps, at random), a ``collective`` phase, a StepCompleted; rank 0
  writes a checkpoint (phase ``checkpoint``, CKPT ms) every ``spec.checkpoint_every`` steps.
  After ``spec.steps`` steps, or on a ``hang`` fault directive, it stops stepping inside
  ``compute`` and sleeps until killed. Each line the agent sends is logged as
  ``directive <line>``.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
import threading
import time
from typing import Any


def line(launch: dict[str, Any], kind: str, **fields: Any) -> bytes:
    report = {
        "kind": kind,
        "node_id": launch["node_id"],
        "job_id": launch["job_id"],
        "generation": launch["generation"],
        "rank": launch["rank"],
        **fields,
    }
    return json.dumps(report).encode() + b"\n"


def step_line(launch: dict[str, Any], step: int, iteration_s: float = 0.01) -> bytes:
    return line(launch, "step_completed", step=step, loss=1 / (step + 1), iteration_s=iteration_s)


def echo(sock: socket.socket, launch: dict[str, Any]) -> int:
    for raw in sock.makefile("rb"):
        directive = json.loads(raw)
        if "exit" in directive:
            return int(directive["exit"])
        sock.sendall(step_line(launch, int(directive["step"])))
    return 0


def listen(sock: socket.socket, halt: threading.Event) -> None:
    """Log every directive; a ``hang`` fault makes the stepping loop stop."""
    for raw in sock.makefile("rb"):
        print("directive", raw.decode().strip(), flush=True)
        if json.loads(raw).get("fault", {}).get("kind") == "hang":
            halt.set()


def step(sock: socket.socket, launch: dict[str, Any], behaviour: str) -> None:
    lo, hi, spike, ckpt = (int(ms) / 1000 for ms in behaviour.split("-")[1:])
    spec, rank = launch["spec"], launch["rank"]
    rng = random.Random(spec["seed"] * 1000 + rank)
    halt = threading.Event()
    threading.Thread(target=listen, args=(sock, halt), daemon=True).start()
    for s in range(spec["steps"]):
        if halt.is_set():
            break
        started = time.monotonic()
        sock.sendall(line(launch, "worker_phase", phase="compute", step=s))
        time.sleep(spike if rng.random() < 1 / 25 else rng.uniform(lo, hi))
        sock.sendall(line(launch, "worker_phase", phase="collective", step=s))
        sock.sendall(step_line(launch, s, time.monotonic() - started))
        if rank == 0 and (s + 1) % spec["checkpoint_every"] == 0:
            sock.sendall(line(launch, "worker_phase", phase="checkpoint", step=s))
            time.sleep(ckpt)
    else:
        s = spec["steps"]
    sock.sendall(line(launch, "worker_phase", phase="compute", step=s))


def main() -> int:
    launch = json.loads(os.environ["UNICRON_WORKER_LAUNCH"])
    print(json.dumps(launch), flush=True)
    print(json.dumps({"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
    behaviour = launch["spec"]["name"]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if behaviour != "mute":
        sock.connect(launch["agent_socket"])
    if behaviour == "echo":
        return echo(sock, launch)
    if behaviour.startswith("step-"):
        step(sock, launch, behaviour)
    elif behaviour != "mute":
        for s in range(min(launch["spec"]["steps"], 100)):
            sock.sendall(step_line(launch, s))
        if behaviour.startswith("exit-"):
            return int(behaviour.removeprefix("exit-"))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
