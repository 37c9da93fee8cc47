"""When ``unicron up`` may start an exited child or server again: back-off for crash loops.

The first restart of a process is immediate, as after a one-off crash. One that exits again
soon after its restart is in a crash loop: each further restart waits twice as long as the
last, up to a cap, so a child that cannot start does not spin the machine or flood the log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RestartBackoff:
    base_s: float = 0.5
    cap_s: float = 8.0
    stable_s: float = 30.0  # a process up this long after a restart is healthy again
    clock: Callable[[], float] = time.monotonic
    restarts: dict[str, int] = field(default_factory=dict)
    _streak: dict[str, int] = field(default_factory=dict)
    _last_restart: dict[str, float] = field(default_factory=dict)
    _not_before: dict[str, float] = field(default_factory=dict)

    def due(self, name: str) -> bool:
        """Whether ``name``, seen exited, may start now; the first call fixes its delay."""
        now = self.clock()
        if name not in self._not_before:
            last = self._last_restart.get(name)
            looping = last is not None and now - last < self.stable_s
            self._streak[name] = self._streak.get(name, 0) + 1 if looping else 0
            self._not_before[name] = now + self.delay(name)
        return now >= self._not_before[name]

    def delay(self, name: str) -> float:
        streak = self._streak.get(name, 0)
        return 0.0 if streak == 0 else min(self.cap_s, self.base_s * 2.0 ** (streak - 1))

    def started(self, name: str) -> int:
        """Record a restart of ``name``; returns how many it has had."""
        self._not_before.pop(name, None)
        self._last_restart[name] = self.clock()
        self.restarts[name] = self.restarts.get(name, 0) + 1
        return self.restarts[name]
