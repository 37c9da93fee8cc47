"""Times the CLI prints: a time of day alone only on the day it is read, in any time zone and
at any hour (CI may run at 02:00; a wait that began 5 h ago began yesterday)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import datetime

import pytest
from unicron.cli.render import clock

# A zone ahead of UTC, one behind, one with half hours, and one with DST.
ZONES = ["UTC", "Asia/Kolkata", "America/Los_Angeles", "Pacific/Chatham", "Europe/Berlin"]


@pytest.fixture(params=ZONES)
def zone(request: pytest.FixtureRequest) -> Iterator[str]:
    before = os.environ.get("TZ")
    os.environ["TZ"] = request.param
    time.tzset()
    yield request.param
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


def _local(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").timestamp()


@pytest.mark.usefixtures("zone")
def test_a_time_of_the_same_day_is_a_time_of_day() -> None:
    now = _local("2026-03-29 02:30:00")  # the small hours, on a DST change day in Berlin
    assert clock(_local("2026-03-29 00:00:01"), now) == "00:00:01"


@pytest.mark.usefixtures("zone")
def test_a_time_of_another_day_carries_its_date() -> None:
    now = _local("2026-12-04 02:08:00")
    assert clock(now - 5 * 3600, now) == "2026-12-03 21:08:00"
    assert clock(_local("2026-12-03 23:59:59"), now) == "2026-12-03 23:59:59"


def test_without_now_the_day_is_today() -> None:
    days_ago = time.time() - 3 * 86400
    assert clock(days_ago) == datetime.fromtimestamp(days_ago).strftime("%Y-%m-%d %H:%M:%S")
