"""``python -m services.agent``: run this node's agent until SIGTERM or SIGINT."""

from __future__ import annotations

import functools

from unicron.services.agent.agent import run
from unicron.services.agent.settings import AgentSettings
from unicron.shared.service import run_service


def main() -> None:
    settings = AgentSettings()
    run_service("agent", settings, functools.partial(run, settings=settings))


if __name__ == "__main__":
    main()
