"""``python -m services.planner``: run the planner service until SIGINT/SIGTERM."""

from __future__ import annotations

from unicron.services.planner.service import planner_body
from unicron.services.planner.settings import PlannerSettings
from unicron.shared.service import run_service


def main() -> None:
    settings = PlannerSettings()
    run_service("planner", settings, planner_body(settings))


if __name__ == "__main__":
    main()
