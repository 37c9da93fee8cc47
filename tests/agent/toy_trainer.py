"""A trainer that is not the built-in GPT, for showing that a warm spare runs whichever trainer
a job's launch names: as the rank its launch gives, it reports ``spec.steps`` steps with the
loss its environment sets (``TOY_LOSS``, from the job's ``env``) and exits 0. It needs no
rendezvous store, so a test can run it alone."""

from __future__ import annotations

import os
import socket
import sys

from unicron.shared.contracts.reports import StepCompleted
from unicron.shared.contracts.workerchannel import WorkerEnv


def main() -> int:
    launch = WorkerEnv.read().launch
    if launch is None:
        print("toy_trainer: no launch in the environment", file=sys.stderr)
        return 2
    loss = float(os.environ["TOY_LOSS"])
    who = {k: getattr(launch, k) for k in ("node_id", "job_id", "generation", "rank")}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(launch.agent_socket)
        for step in range(launch.spec.steps):
            report = StepCompleted(**who, step=step, loss=loss, iteration_s=0.001)
            sock.sendall(report.model_dump_json().encode() + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
