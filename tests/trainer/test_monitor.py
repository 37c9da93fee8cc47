"""The step monitor's reports and the sample ledger's lines: what the training thread hands off
cheaply must read, byte for byte, as the models and the ledger always wrote them."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from unicron.shared.contracts.messages import Rendezvous
from unicron.shared.contracts.reports import StepCompleted, WorkerPhase
from unicron.shared.contracts.workerchannel import WorkerLaunch
from unicron.trainer.channel import Report
from unicron.trainer.faults import FaultInbox
from unicron.trainer.ledger import LEDGER_FILE, Ledger, LedgerEntry, read_ledger
from unicron.trainer.loop import StepMonitor

from tests.trainer.harness import make_spec

WHO = {"node_id": "node-a", "job_id": "job-t", "generation": 3, "rank": 1}


class Kept:
    """A channel that keeps what it is sent."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def send(self, report: Report) -> None:
        self.reports.append(report)

    def flush(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass


def launch() -> WorkerLaunch:
    return WorkerLaunch(
        **WHO,
        world_size=2,
        spec=make_spec(),
        rendezvous=Rendezvous(host="127.0.0.1", port=1, prefix="job-t/"),
        checkpoint_dir="/nonexistent",
        agent_socket="/nonexistent.sock",
    )


def test_the_monitors_reports_are_the_lines_the_models_write() -> None:
    channel = Kept()
    monitor = StepMonitor(launch(), channel, FaultInbox(1), resumed_from=4)
    for step in (5, 6):
        monitor.before_compute(step)
        monitor.before_collective(step)
        monitor.after_collective(step)
        monitor.completed(step, 2.5, 0.125)
    monitor.phase("checkpoint", 6)
    lines = [report.model_dump_json() for report in channel.reports]
    at = [json.loads(line)["at"] for line in lines]
    compute_s = [json.loads(line).get("compute_s") for line in lines]
    assert at == sorted(at) and all(isinstance(t, float) for t in at)
    assert lines == [
        WorkerPhase(**WHO, at=at[0], phase="compute", step=5).model_dump_json(),
        WorkerPhase(**WHO, at=at[1], phase="collective", step=5).model_dump_json(),
        StepCompleted(
            **WHO, at=at[2], step=5, loss=2.5, iteration_s=0.125, compute_s=compute_s[2],
            resumed_from=4,
        ).model_dump_json(),
        WorkerPhase(**WHO, at=at[3], phase="compute", step=6).model_dump_json(),
        WorkerPhase(**WHO, at=at[4], phase="collective", step=6).model_dump_json(),
        StepCompleted(
            **WHO, at=at[5], step=6, loss=2.5, iteration_s=0.125, compute_s=compute_s[5]
        ).model_dump_json(),
        WorkerPhase(**WHO, at=at[6], phase="checkpoint", step=6).model_dump_json(),
    ]  # fmt: skip
    assert compute_s[2] is not None and compute_s[2] >= 0.0


@pytest.mark.parametrize("counted", [[1] * 4, [1] * 4096])
def test_a_ledger_line_is_the_entry_as_json(tmp_path: Path, counted: list[int]) -> None:
    entry = LedgerEntry(7, 2, 4, 0, [0, 4], counted)
    Ledger(str(tmp_path / "ck")).record(entry)
    assert (tmp_path / "ck" / LEDGER_FILE).read_text() == json.dumps(asdict(entry)) + "\n"


def test_ranks_0_of_successive_generations_append_to_one_ledger(tmp_path: Path) -> None:
    first, second, other = Ledger(str(tmp_path)), Ledger(str(tmp_path)), Ledger(str(tmp_path))
    entries = [LedgerEntry(step, 1 + step // 3, 2, 0, [0], [1, 1]) for step in range(1, 7)]
    for entry in entries:
        (first if entry.generation == 1 else second).record(entry)
        other.record(LedgerEntry(entry.step, entry.generation, 2, 1, [1], [1, 1]))
    assert read_ledger(tmp_path) == entries  # rank 1 keeps its own in memory only
    assert [e.rank for e in other.entries] == [1] * 6
