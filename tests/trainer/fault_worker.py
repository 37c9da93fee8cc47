"""A worker with a fault hook, for tests: ``python -m tests.trainer.fault_worker``.

``UNICRON_TEST_FAULT`` is JSON ``{"rank": r, "step": s, "message": "..."}``: that rank raises
``RuntimeError(message)`` at the start of that step, as if a real fault had struck there.
"""

from __future__ import annotations

import json
import os

from unicron.shared.logging import configure_logging
from unicron.trainer.runtime import StepContext, run
from unicron.trainer.worker import exit_now, read_launch


def main() -> int:
    launch = read_launch()
    fault = json.loads(os.environ["UNICRON_TEST_FAULT"])
    configure_logging(f"trainer.rank{launch.rank}")

    def hook(ctx: StepContext) -> None:
        if ctx.launch.rank == fault["rank"] and ctx.step == fault["step"]:
            raise RuntimeError(fault["message"])

    return run(launch, fault_hook=hook)


if __name__ == "__main__":
    exit_now(main())
