"""``unicron up``'s restart back-off: a one-off crash restarts at once, a crash loop waits."""

from __future__ import annotations

from unicron.cli.restarts import RestartBackoff


def test_a_crash_loop_waits_longer_each_time_and_a_stable_process_starts_over() -> None:
    clock = [100.0]
    backoff = RestartBackoff(base_s=0.5, cap_s=2.0, stable_s=30.0, clock=lambda: clock[0])
    assert backoff.due("redis-server")  # the first crash: at once
    backoff.started("redis-server")
    waits = []
    for _ in range(4):  # it keeps dying right after each restart
        clock[0] += 0.1
        assert not backoff.due("redis-server")
        waits.append(backoff.delay("redis-server"))
        clock[0] += waits[-1]
        assert backoff.due("redis-server")
        backoff.started("redis-server")
    assert waits == [0.5, 1.0, 2.0, 2.0]
    clock[0] += 60.0  # up a minute: healthy again, so the next crash restarts at once
    assert backoff.due("redis-server")
    assert backoff.started("redis-server") == 6
