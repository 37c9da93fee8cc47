"""``bench/scale.py`` at its smallest: the real control plane on its own NATS and Redis, driven
by a fleet of simulated agents, detects and recovers from a fault of every kind, and the bench
reports each size on aligned lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.scale import FAULT_KINDS, figures, measure, parse, table


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_simulated_agents_fail_and_the_control_plane_recovers_every_kind(
    tmp_path: Path,
) -> None:
    args = parse(["--nodes", "4", "--trials", "1", "--step-s", "0.5", "--window-s", "2"])
    result = await measure(4, args, tmp_path)
    logs = f"logs: {tmp_path / 'logs'}"
    assert result.missed == [], f"{result.missed}\n{logs}"
    assert result.start_s is not None
    for kind in FAULT_KINDS:
        assert len(result.detect[kind]) == 1, f"{kind}: {result.detect}\n{logs}"
    assert len(result.recovery) == len(FAULT_KINDS), logs
    assert len(result.commands) == len(FAULT_KINDS), logs
    assert result.rates is not None and set(result.rates.cores) == {
        "api", "detector", "planner", "executor",
    }  # fmt: skip
    line = figures([result])
    assert {len(v) for v in line.values()} == {1} and line["nodes"] == [4]
    assert "crash detect p50/p99 (s)" in table([result])
