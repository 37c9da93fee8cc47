"""``python -m unicron.services.planner``: run the planner service until SIGINT/SIGTERM."""

from __future__ import annotations

import sys

from pydantic import ValidationError
from unicron.services.planner.service import planner_body
from unicron.services.planner.settings import PlannerSettings
from unicron.shared.service import run_service


def main() -> None:
    try:
        settings = PlannerSettings()
    except ValidationError as exc:  # one line per bad setting, not a traceback
        lines = [f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()]
        sys.exit("planner: bad settings:\n  " + "\n  ".join(lines))
    run_service("planner", settings, planner_body(settings))


if __name__ == "__main__":
    main()
