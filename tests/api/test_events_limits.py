"""UNICRON_EVENTS's limits come from the API's settings, and only from them: a restart with
other values changes them, another service starting does not reset them."""

from __future__ import annotations

from nats.js.api import StreamConfig
from unicron.shared.bus.bus import Bus
from unicron.shared.bus.streams import EVENTS_STREAM

from tests.api.live import serve_api


async def limits(bus: Bus) -> tuple[float | None, int | None]:
    config: StreamConfig = (await bus.js.stream_info(EVENTS_STREAM)).config
    # a re-published event is still dropped within the age limit (or two minutes)
    assert config.duplicate_window == min(120, config.max_age or 120)
    return config.max_age, config.max_bytes


async def test_event_stream_limits_follow_the_settings_across_restarts(
    nats_url: str, redis_url: str, bus: Bus
) -> None:
    with serve_api(nats_url, redis_url, events_max_age_s=3600, events_max_bytes=50_000_000):
        assert await limits(bus) == (3600, 50_000_000)

    # A service that manages streams starts with a bare environment: the limits stay.
    other = await Bus.connect(nats_url, "unicron/detector", 10, replicas=1)
    await other.close()
    assert await limits(bus) == (3600, 50_000_000)

    with serve_api(nats_url, redis_url, events_max_age_s=60, events_max_bytes=0):
        assert await limits(bus) == (60, -1)  # 0: no limit on the size
    with serve_api(nats_url, redis_url):  # the defaults: a week, 1 GiB
        assert await limits(bus) == (7 * 86400, 1 << 30)
