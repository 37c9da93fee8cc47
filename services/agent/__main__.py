"""``python -m unicron.services.agent``: run this node's agent until SIGTERM or SIGINT.

Bad settings and an address peers could not reach end the start with exit code 2 and a line
that names the setting to fix, before the agent connects to anything.
"""

from __future__ import annotations

import functools
import sys

from pydantic import ValidationError
from unicron.services.agent.address import AddressError, advertised_host
from unicron.services.agent.agent import run
from unicron.services.agent.settings import AgentSettings
from unicron.shared.logging import configure_logging, get_logger
from unicron.shared.service import run_service


def load_settings() -> AgentSettings:
    """The settings, or exit 2 with one line per bad setting instead of a traceback."""
    try:
        return AgentSettings()
    except ValidationError as exc:
        for error in exc.errors(include_input=False, include_url=False):
            where = "UNICRON_" + str(error["loc"][0]).upper() if error["loc"] else "settings"
            print(f"agent: invalid {where}: {error['msg']}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    settings = load_settings()
    configure_logging("agent", settings.log_level, settings.log_format)
    try:
        # resolved once, here: every part then advertises the same address
        host = advertised_host(settings.host, settings.nats_url)
    except AddressError as exc:
        get_logger(component="agent", node_id=settings.node_id).error(
            "agent cannot start", error=str(exc)
        )
        sys.exit(2)
    settings = settings.model_copy(update={"host": host})
    run_service("agent", settings, functools.partial(run, settings=settings))


if __name__ == "__main__":
    main()
