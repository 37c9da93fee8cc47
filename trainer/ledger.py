"""The sample ledger: which micro-batches of each step reached the optimizer, and how often.

Every step's all-reduce carries a count per micro-batch index (see
:func:`unicron.trainer.parallel.reduce_work`), so every rank learns how many times each sample of
the global batch was summed into the update — across regroups, shrinks and partial-step reuse.
Each rank keeps the entries in memory; rank 0 of whichever generation is current also appends
them to ``<checkpoint_dir>/ledger.jsonl``, so a test or an operator can check after the fact
that every sample of every step was used exactly once (docs/design.md §5).
"""

from __future__ import annotations

import json
import os
import weakref
from dataclasses import dataclass
from pathlib import Path

LEDGER_FILE = "ledger.jsonl"


@dataclass(frozen=True)
class LedgerEntry:
    step: int
    generation: int
    world_size: int
    rank: int
    own: list[int]  # micro-batch indices this rank summed into the step
    counted: list[int]  # per index, how many ranks summed it (all ones when exact)


class Ledger:
    """Entries of the steps this rank applied; rank 0 also writes them down."""

    def __init__(self, checkpoint_dir: str) -> None:
        self.path = Path(checkpoint_dir) / LEDGER_FILE
        self.entries: list[LedgerEntry] = []
        self._fd: int | None = None

    def record(self, entry: LedgerEntry) -> None:
        self.entries.append(entry)
        if entry.rank != 0:
            return
        line = json.dumps(
            {
                "step": entry.step,
                "generation": entry.generation,
                "world_size": entry.world_size,
                "rank": entry.rank,
                "own": entry.own,
                "counted": entry.counted,
            }
        )
        # One short line per step, in one append: a crash loses at most the line being written,
        # and ranks 0 of successive generations may share the file. The file stays open: an
        # open and a close a step cost more than the rest of the ledger.
        os.write(self._file(), (line + "\n").encode())

    def _file(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            weakref.finalize(self, os.close, self._fd)
        return self._fd


def read_ledger(checkpoint_dir: str | Path) -> list[LedgerEntry]:
    """Every complete entry in ``<checkpoint_dir>/ledger.jsonl``, in the order written."""
    path = Path(checkpoint_dir) / LEDGER_FILE
    if not path.exists():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(LedgerEntry(**json.loads(line)))
        except (ValueError, TypeError):
            continue  # a torn last line
    return entries
