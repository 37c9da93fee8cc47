"""How a worker process ends: its exit codes, and a leave that skips interpreter teardown.

The agent reads the codes (:mod:`unicron.services.agent.supervisor`): 0 done, 1 failed (its
exception was reported first), 2 a launch it could not use.
"""

from __future__ import annotations

import os
import sys

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_LAUNCH = 2


def exit_now(code: int) -> None:
    """Leave without running interpreter teardown, which can hang on a broken process group.

    Everything worth keeping (reports, checkpoints) is already out when the run is closed.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
