"""The GPT worker with a fault in its loop body: ``python -m tests.trainer.fault_worker``.

``UNICRON_TEST_FAULT`` is JSON ``{"rank": r, "step": s, "message": "..."}``: that rank raises
``RuntimeError(message)`` in the loop body at that step, outside anything Unicron runs —
the exception hook of :func:`unicron.train.init` must still report it before the exit.
"""

from __future__ import annotations

import json
import os

from unicron.shared.logging import configure_logging
from unicron.trainer import gpt
from unicron.trainer.exits import exit_now
from unicron.trainer.model import GPT

import unicron.train


def main() -> int:
    fault = json.loads(os.environ["UNICRON_TEST_FAULT"])
    run = unicron.train.init()
    configure_logging(f"trainer.rank{run.rank}")

    def hook(run: unicron.train.Run, model: GPT) -> None:
        if run.rank == fault["rank"] and run.step == fault["step"]:
            raise RuntimeError(fault["message"])

    gpt.train(run, hook)
    run.close()
    return 0


if __name__ == "__main__":
    exit_now(main())
