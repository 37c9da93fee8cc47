"""A stand-in for ``unicron.trainer.worker`` in the agent's tests: stdlib only, so it starts fast.

It prints its launch JSON and then ``{"cuda_visible_devices": ...}`` (to the log file the agent
gave it), connects to the agent's socket (``mute`` never does: it only sleeps until killed),
then acts on ``spec.name``:

- ``exit-N`` sends ``spec.steps`` StepCompleted lines and exits with N;
- ``burst`` waits for the file ``$BURST_GO``, then sends ``spec.steps`` lines on a connection
  of its own and exits 0;
- ``hang`` sends them and sleeps until killed;
- ``echo`` sends nothing unasked but reads directives from the socket: a fault drill of kind
  ``exit`` makes it exit with its ``exit_code``, any other drill is answered with a
  StepCompleted for the drill's ``at_step``;
- ``step-LO-HI-SPIKE-CKPT`` (milliseconds) steps like a trainer: a ``compute`` phase of LO to HI
  ms (SPIKE ms once in 25 steps, at random), a ``collective`` phase, a StepCompleted; rank 0
  writes a checkpoint (phase ``checkpoint``, CKPT ms) every ``spec.checkpoint_every`` steps.
  After ``spec.steps`` steps, or on a ``hang`` fault directive, it stops stepping inside
  ``compute`` and sleeps until killed. Each line the agent sends is logged as
  ``directive <line>``. A ``regroup`` directive makes it answer ``worker_regrouped`` and carry
  on under the new generation and rank (the worker side of the regroup protocol, minimally).

Started as a warm spare (``UNICRON_WORKER_SPARE=1``, as the agent's spare pool marks one) it
connects to ``$UNICRON_AGENT_SOCKET`` at once (or, with ``$SPARE_GATE`` naming a FIFO, once the
test opens that for writing: a spare still warming up for as long as the test wants), and waits
for one line
``{"directive": "launch", "launch": ..., "script": ...}``, logs ``served by spare <script argv>``
and goes on as if launched with it (it plays whichever trainer the script names).
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

SEND = threading.Lock()  # the stepping loop and the directive listener both write lines


def send(sock: socket.socket, data: bytes) -> None:
    with SEND:
        sock.sendall(data)


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
        fault = json.loads(raw)["fault"]
        if fault["kind"] == "exit":
            return int(fault["exit_code"])
        sock.sendall(step_line(launch, int(fault["at_step"])))
    return 0


def listen(sock: socket.socket, launch: dict[str, Any], halt: threading.Event) -> None:
    """Log every directive; a ``hang`` fault makes the stepping loop stop; a regroup changes
    who the worker is from its next line on."""
    for raw in sock.makefile("rb"):
        print("directive", raw.decode().strip(), flush=True)
        directive = json.loads(raw)
        if directive.get("fault", {}).get("kind") == "hang":
            halt.set()
        if directive.get("directive") == "regroup":
            with SEND:
                for name in ("generation", "rank", "world_size"):
                    launch[name] = directive[name]
            source = "none" if directive.get("state_source_rank") is None else "memory"
            send(sock, line(launch, "worker_regrouped", pid=os.getpid(),
                            world_size=directive["world_size"], regroup_s=0.001,
                            state_source=source, resumed_step=0))  # fmt: skip


def step(sock: socket.socket, launch: dict[str, Any], behaviour: str) -> None:
    lo, hi, spike, ckpt = (int(ms) / 1000 for ms in behaviour.split("-")[1:])
    spec, rank = launch["spec"], launch["rank"]
    rng = random.Random(spec["seed"] * 1000 + rank)
    halt = threading.Event()
    threading.Thread(target=listen, args=(sock, launch, halt), daemon=True).start()
    if launch.get("state_source_rank") is not None:  # a joiner: says it took a peer's state
        send(sock, line(launch, "worker_regrouped", pid=os.getpid(),
                        world_size=launch["world_size"], regroup_s=0.001, state_transfer_s=0.002,
                        state_source="peer", resumed_step=0))  # fmt: skip
    for s in range(spec["steps"]):
        if halt.is_set():
            break
        started = time.monotonic()
        send(sock, line(launch, "worker_phase", phase="compute", step=s))
        time.sleep(spike if rng.random() < 1 / 25 else rng.uniform(lo, hi))
        send(sock, line(launch, "worker_phase", phase="collective", step=s))
        send(sock, step_line(launch, s, time.monotonic() - started))
        if rank == 0 and (s + 1) % spec["checkpoint_every"] == 0:
            send(sock, line(launch, "worker_phase", phase="checkpoint", step=s))
            time.sleep(ckpt)
    else:
        s = spec["steps"]
    send(sock, line(launch, "worker_phase", phase="compute", step=s))


def wait_as_spare() -> tuple[socket.socket, dict[str, Any], list[str]]:
    """Connect at once, then read the launch line byte by byte (no buffer to lose); the
    socket, the launch and the argv of the process it names."""
    gate = os.environ.get("SPARE_GATE")
    if gate:
        with open(gate, "rb") as fifo:  # blocks until a writer opens it; EOF once it closed
            fifo.read()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ["UNICRON_AGENT_SOCKET"])
    raw = b""
    while not raw.endswith(b"\n"):
        byte = sock.recv(1)
        if not byte:
            sys.exit(3)
        raw += byte
    message = json.loads(raw)
    assert message["directive"] == "launch", message
    os.environ.update(message["script"]["env"])  # as a real spare runs with the launch's env
    return sock, dict(message["launch"]), list(message["script"]["argv"])


def main() -> int:
    spare = os.environ.get("UNICRON_WORKER_SPARE") == "1"
    script: list[str] = []
    if spare:
        sock, launch, script = wait_as_spare()
    else:
        launch = json.loads(os.environ["UNICRON_WORKER_LAUNCH"])
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    print(json.dumps(launch), flush=True)
    print(json.dumps({"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
    if spare:
        print("served by spare", json.dumps(script), flush=True)
    behaviour = launch["spec"]["name"]
    if behaviour != "mute" and not spare:
        sock.connect(launch["agent_socket"])
    if behaviour == "echo":
        return echo(sock, launch)
    if behaviour == "burst":  # once $BURST_GO exists: every step on a new connection, then gone
        while not os.path.exists(os.environ["BURST_GO"]):
            time.sleep(0.01)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as late:
            late.connect(launch["agent_socket"])
            for s in range(launch["spec"]["steps"]):
                send(late, step_line(launch, s))
        return 0
    if behaviour.startswith("step-"):
        step(sock, launch, behaviour)
    elif behaviour != "mute":
        for s in range(min(launch["spec"]["steps"], 100)):
            send(sock, step_line(launch, s))
        if behaviour.startswith("exit-"):
            return int(behaviour.removeprefix("exit-"))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
