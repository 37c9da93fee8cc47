"""Failure traces: a CSV of ``time_s,node,category,repair_s`` rows, or one generated from the
paper's failure mix (docs/design.md §3) at a per-GPU failure rate.

``node`` is a node index (0-based) or a name ``node-007``; ``category`` is a
:class:`unicron.shared.contracts.taxonomy.FailureCategory` value, whose severity comes from the
taxonomy's table; ``repair_s`` is how long the node is out of service (0 for faults that leave it
healthy).

Generation: failures arrive as a Poisson process of rate ``rate_per_gpu_h`` x GPUs, each on a
uniformly drawn node, with a category drawn from the paper's shares of the largest jobs that
ended abnormally (Table 1: NCCL timeout 10.1 %, ECC 5.0 %, ...; "others" as software_other).
Faults of severity SEV1 (the node is broken) take the node out for an exponentially distributed
repair of mean ``repair_h`` (at least 30 min: an assumption — the paper only says "hours");
SEV2/SEV3 faults leave the node healthy.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from unicron.shared.contracts.taxonomy import FailureCategory, Severity, severity_of
from unicron.simulator.inputs import InputError

C = FailureCategory
# Share (percent) of the paper's largest jobs that ended with each error (docs/design.md §3).
PAPER_MIX: dict[FailureCategory, float] = {
    C.NCCL_TIMEOUT: 10.1, C.ECC: 5.0, C.NVLINK: 4.5, C.NETWORK_OTHER: 4.0,
    C.LINK_FLAPPING: 3.9, C.SOFTWARE_OTHER: 3.3, C.TASK_HANG: 3.1, C.ILLEGAL_MEMORY: 2.1,
    C.INVALID_DMA: 2.1, C.CONNECTION_REFUSED: 2.1, C.CUDA_ERROR: 1.6,
    C.CONNECTION_RESET: 1.0, C.GPU_DRIVER: 0.6,
}  # fmt: skip
COLUMNS = ("time_s", "node", "category", "repair_s")
MIN_REPAIR_S = 1800.0


@dataclass(frozen=True)
class Failure:
    time_s: float
    node: int
    category: FailureCategory
    repair_s: float

    @property
    def severity(self) -> Severity:
        return severity_of(self.category)[0]


def node_name(index: int) -> str:
    return f"node-{index:05d}"


def _node(value: str, nodes: int) -> int:
    text = value.strip()
    index = int(text.rsplit("-", 1)[-1]) if text.startswith("node-") else int(text)
    if not 0 <= index < nodes:
        raise ValueError(f"node {text!r} is not in the cluster (0..{nodes - 1})")
    return index


def _row(row: dict[str, str], nodes: int) -> Failure:
    field = "time_s"
    try:
        time_s = float(row["time_s"])
        if not time_s >= 0:
            raise ValueError("must be ≥ 0")
        field = "node"
        node = _node(row["node"], nodes)
        field = "category"
        category = FailureCategory(row["category"].strip())
        field = "repair_s"
        repair = float(row["repair_s"] or 0)
        if not repair >= 0:
            raise ValueError("must be ≥ 0")
    except (ValueError, TypeError, AttributeError) as exc:
        known = ", ".join(c.value for c in FailureCategory) if field == "category" else ""
        raise ValueError(
            f"{field}: {row.get(field)!r}: {exc}" + (f" (one of {known})" if known else "")
        ) from None
    return Failure(time_s, node, category, repair)


def load_trace(path: Path, nodes: int) -> list[Failure]:
    """The failures of a CSV trace, sorted by time; errors name the line and the field."""
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise InputError(path, 0, f"cannot read: {exc.strerror}") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise InputError(
                path,
                1,
                f"header must have columns {','.join(COLUMNS)}; missing {','.join(missing)}",
            )
        failures = []
        for row in reader:
            try:
                failures.append(_row(row, nodes))
            except ValueError as exc:
                raise InputError(path, reader.line_num, str(exc)) from exc
    return sorted(failures, key=lambda f: (f.time_s, f.node))


def generate_trace(
    nodes: int,
    gpus_per_node: int,
    rate_per_gpu_h: float,
    days: float,
    seed: int,
    repair_h: float = 4.0,
) -> list[Failure]:
    """A trace of the paper's failure mix (see the module docstring)."""
    rng = np.random.default_rng(seed)
    horizon = days * 86400.0
    mean_gap = 3600.0 / (rate_per_gpu_h * nodes * gpus_per_node)
    count = int(rng.poisson(horizon / mean_gap))
    times = np.sort(rng.uniform(0.0, horizon, count))
    cats = list(PAPER_MIX)
    shares = np.array([PAPER_MIX[c] for c in cats])
    picks = rng.choice(len(cats), size=count, p=shares / shares.sum())
    where = rng.integers(0, nodes, size=count)
    repairs = np.maximum(rng.exponential(repair_h * 3600.0, size=count), MIN_REPAIR_S)
    trace = []
    for t, k, n, r in zip(times, picks, where, repairs, strict=True):
        category = cats[int(k)]
        sev1 = severity_of(category)[0] == Severity.SEV1
        trace.append(
            Failure(round(float(t), 1), int(n), category, round(float(r), 1) if sev1 else 0.0)
        )
    return trace


def write_trace(path: Path, failures: list[Failure]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for f in failures:
            writer.writerow((f"{f.time_s:g}", f.node, f.category.value, f"{f.repair_s:g}"))
