"""``bench/simulate.py``: the failure-rate sweep on the 128-GPU example, kept short (2 days)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from unicron.simulator.policies import BASELINES, NAMES
from unicron.simulator.scenario import load_inputs

from bench.simulate import CLUSTER, JOBS, main, sweep

LOW, HIGH = 1.6e-3, 1.5e-2  # about 5 and 46 failures a day on 128 GPUs


def test_higher_rate_more_failures_and_restart_loses_more() -> None:
    low, high = sweep(load_inputs(CLUSTER, JOBS), [LOW, HIGH], [1], days=2)
    assert (low.rate, high.rate) == (LOW, HIGH)
    assert high.failures_per_day > 3 * low.failures_per_day > 0
    assert high.ettr["restart"] < low.ettr["restart"] < 1.0
    assert set(high.waf) == set(NAMES) and all(v > 0 for v in high.waf.values())
    for point in (low, high):
        best = point.ratios["best"]
        per_baseline = [point.ratios[b]["min"] for b in BASELINES]
        assert best["min"] == best["mean"]  # one seed
        assert best["min"] == min(v for v in per_baseline if v is not None)


def test_prints_one_json_object_last(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.json"
    main(["--rates", str(LOW), "--seeds", "1", "--days", "1", "--out", str(out)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    doc = json.loads(last)
    assert doc["gpus"] == 128 and doc["seeds"] == [1]
    assert set(doc["rates"][f"{LOW:g}"]["ratio_unicron_to"]) == {*BASELINES, "best"}
    assert json.loads(out.read_text())["runs"][0]["seed"] == 1
