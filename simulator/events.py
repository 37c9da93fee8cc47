"""The discrete-event queue: events ordered by time, then by kind, then by insertion.

Kinds are ordered so that at one instant repairs come before failures (a node repaired and hit
at the same second is hit after it is back), failures before arrivals, and samples last (a
sample sees the state every event of its instant made). Insertion order breaks the remaining
ties, so a run is a pure function of its inputs.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class Kind(IntEnum):
    REPAIR = 0  # a node is back in service
    FAILURE = 1  # a fault from the trace
    ARRIVAL = 2  # a job is submitted
    FINISH = 3  # a job may have done its work (stale if its version moved on)
    WAKE = 4  # a policy asked to be called back (e.g. a job's manual resubmission)
    SAMPLE = 5  # record the timelines


@dataclass(order=True, frozen=True)
class Event:
    time_s: float
    kind: Kind
    seq: int
    payload: Any = field(compare=False, default=None)


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0

    def push(self, time_s: float, kind: Kind, payload: Any = None) -> None:
        heapq.heappush(self._heap, Event(time_s, kind, self._seq, payload))
        self._seq += 1

    def pop(self) -> Event:
        return heapq.heappop(self._heap)

    def __len__(self) -> int:
        return len(self._heap)
