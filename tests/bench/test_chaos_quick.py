"""``bench/chaos.py --quick`` on the real stack: a few faults of every kind while a control-plane
service is killed and Redis restarts; every fault is detected exactly once and every job ends
with the parameters and sample ledger of a failure-free run, with no worker left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import chaos, summary
from bench.chaos_plan import make_plan
from bench.chaos_report import notes


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_quick_chaos_run_loses_no_fault_no_job_and_no_worker(tmp_path: Path) -> None:
    plan = make_plan(seed=0, faults=4, lanes=2, quick=True)
    result = await chaos(plan, tmp_path)
    figures = summary(result)
    why = "\n".join(notes(result)) + f"\nlogs: {result.data_dir / 'logs'}"
    assert figures["faults"] == figures["faults_planned"] == 4, why
    assert figures["service_kills"] == 1 and figures["infra_restarts"] == 1, why
    assert figures["jobs_succeeded"] == figures["jobs"], why
    for count in ("jobs_stuck", "missed_failures", "duplicate_failures", "orphan_workers"):
        assert figures[count] == 0, f"{count}: {figures[count]}\n{why}"
    assert figures["exact_semantics"] is True, why
