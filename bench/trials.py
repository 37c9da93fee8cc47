"""What one recovery trial measured, and a series of them, as the recovery benchmarks report it."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field


@dataclass
class Trial:
    recover_s: float
    lost_steps: int
    source: str
    kind: str
    phases: dict[str, float] = field(default_factory=dict)
    fallback: str | None = None


@dataclass
class Series:
    name: str
    trials: list[Trial] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def recover(self) -> list[float]:
        return [t.recover_s for t in self.trials]


def progress(series: Series) -> None:
    t = series.trials[-1]
    print(f"{series.name} #{len(series.trials)}: {t.recover_s:.3f} s, lost {t.lost_steps}, "
          f"fallback {t.fallback}, "
          f"{t.kind}/{t.source} {t.phases}", file=sys.stderr, flush=True)  # fmt: skip
