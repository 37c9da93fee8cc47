"""``python -m unicron.services.probe``: the readiness check of a service without an HTTP
endpoint (the detector, planner, executor and agent in deploy/kubernetes).

Exit 0 when NATS and Redis both accept this container's own logins, read as its service reads
them (``UNICRON_NATS_URL``/``_USER``/``_PASSWORD``, ``UNICRON_REDIS_URL``, and
``/run/secrets/unicron.env``); else exit 1 with one line naming each that does not. The same
question the API's ``/readyz`` answers for the API. No password is ever printed.
"""

from __future__ import annotations

import asyncio
import sys

from unicron.shared.bus.natslogin import open_client
from unicron.shared.outage import Outage
from unicron.shared.settings import CommonSettings
from unicron.shared.store.redisauth import redacted
from unicron.shared.store.state import StateStore

TIMEOUT_S = 3.0  # each server; the probe's own timeout in the manifests leaves room for both


async def _nats(settings: CommonSettings) -> str | None:
    link = Outage("nats connection", component="probe")
    try:
        client = await open_client(
            settings.nats_url, "unicron/probe", TIMEOUT_S, settings.nats_access, link
        )
    except Exception as exc:
        return f"nats at {settings.nats_url}: {type(exc).__name__}: {exc}"
    await client.close()
    return None


async def _redis(settings: CommonSettings) -> str | None:
    try:  # through the Sentinels when the service would use them
        store = await StateStore.connect(
            settings.redis_url, TIMEOUT_S, sentinel=settings.redis_sentinel
        )
    except Exception as exc:
        return f"redis at {redacted(settings.redis_url)}: {type(exc).__name__}: {exc}"
    await store.close()
    return None


async def failures(settings: CommonSettings) -> list[str]:
    """One line per server that does not accept this container's login."""
    results = await asyncio.gather(_nats(settings), _redis(settings))
    return [result for result in results if result is not None]


def main() -> None:
    failed = asyncio.run(failures(CommonSettings()))
    for line in failed:
        print(line, file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
