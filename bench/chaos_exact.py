"""Exact semantics of a chaos run: each job ends with the parameters and the sample ledger of a
failure-free run of the same job.

The failure-free run is the same spec run once on the same stack before any fault
(:mod:`bench.chaos`): the same world size and code path, so the runtime writes its final
checkpoint and ledger the same way (``tests/e2e/test_train_api_job.py`` compares them alike).
The data order is a pure function of (seed, step, micro-batch), so a regroup does not change
the update, and the leftovers of an interrupted step are summed in the failure-free order
(docs/design.md §5).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from unicron.trainer.checkpoint import checkpoint_path
from unicron.trainer.ledger import LedgerEntry, read_ledger

# A recovered step sums its micro-batches in the failure-free order (docs/design.md §5), so at
# the same world size a job ends bit-identical to its reference; the bound only leaves room for
# kernels that are not deterministic. Sums in another order are not noise here: one reordered
# step grew to a 0.26 difference in 1,000 steps of the script workload, and world sizes 1 and 2
# differ by 0.65 after 2,000.
RELATIVE_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Exactness:
    max_relative_diff: float | None  # of the final parameters, worst tensor
    ledger_exact: bool
    redone_steps: int  # steps trained twice (a restart from the checkpoint redoes them)
    problem: str = ""

    @property
    def exact(self) -> bool:
        diff = self.max_relative_diff
        return diff is not None and diff <= RELATIVE_TOLERANCE and self.ledger_exact


def _parameters(directory: Path, step: int) -> dict[str, torch.Tensor]:
    state = torch.load(checkpoint_path(directory, step), map_location="cpu", weights_only=True)
    return dict(state["model"])


def _lineage(entries: list[LedgerEntry]) -> dict[int, LedgerEntry]:
    """Each step's entry from the run that led to the final state: the last one written (a
    restart from a checkpoint writes the steps it redoes again)."""
    return {entry.step: entry for entry in entries}


def compare(got: Path, reference: Path, steps: int) -> Exactness:
    """``got``'s final parameters and ledger against the failure-free ``reference``'s."""
    try:
        mine, want = _parameters(got, steps), _parameters(reference, steps)
    except (OSError, RuntimeError, KeyError) as exc:
        return Exactness(None, False, 0, f"no final checkpoint: {exc}")
    worst = 0.0
    for name, tensor in want.items():
        if name not in mine or mine[name].shape != tensor.shape:
            return Exactness(None, False, 0, f"parameter {name} missing or reshaped")
        scale = tensor.abs().max().clamp_min(1e-12)
        worst = max(worst, float((mine[name] - tensor).abs().max() / scale))
    entries = read_ledger(got)
    lineage, expected = _lineage(entries), _lineage(read_ledger(reference))
    problem = ""
    if sorted(lineage) != list(range(1, steps + 1)):
        missing = sorted(set(range(1, steps + 1)) - set(lineage))
        problem = f"ledger lacks {len(missing)} steps (first {missing[:5]})"
    else:
        wrong = [s for s, e in lineage.items() if e.counted != expected[s].counted]
        problem = f"steps whose samples were not each used once: {wrong[:5]}" if wrong else ""
    return Exactness(worst, not problem, len(entries) - len(lineage), problem)
