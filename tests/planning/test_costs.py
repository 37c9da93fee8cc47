"""Transition costs: which transition each worker count means, and what it is predicted to cost."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from unicron.planning.api import KINDS, SOURCES, JobDemand, StateSource, TransitionKind
from unicron.planning.clusters import A100, CPU
from unicron.planning.costs import ModelledDowntime, classify
from unicron.planning.spec import ModelShape
from unicron.planning.throughput import MegatronThroughput

X = np.arange(0, 9, dtype=np.int64)
GPT_13B = ModelShape(40, 40, 5120, 2048, 51200)
GPT_30B = ModelShape(48, 56, 7168, 2048, 51200)  # needs all 8 GPUs of a node for one replica


def kinds(demand: JobDemand) -> list[str]:
    return [KINDS[k].value for k in classify(demand, X)]


def test_each_worker_count_names_its_transition() -> None:
    waiting = JobDemand("j", 1.0, 1, 8)
    assert kinds(waiting) == ["none"] + ["start"] * 8
    assert kinds(JobDemand("j", 1.0, 1, 8, resume=True))[1] == "resume"
    running = JobDemand("j", 1.0, 1, 8, current=4, world_size=4)
    assert kinds(running) == ["stop", *["shrink"] * 3, "none", *["grow"] * 4]
    faulted = JobDemand("j", 1.0, 1, 8, current=4, hit=True, world_size=4, recovery="restart")
    assert kinds(faulted)[3:6] == ["shrink", "restart", "grow"]
    flaky = JobDemand("j", 1.0, 1, 8, current=4, hit=True, world_size=4, recovery="reattempt")
    assert kinds(flaky)[4] == "reattempt"
    lost_node = JobDemand("j", 1.0, 1, 8, current=2, hit=True, world_size=4)
    assert kinds(lost_node)[:6] == ["stop", "shrink", "shrink", "migrate", "migrate", "grow"]


def costs(demand: JobDemand, cost: ModelledDowntime, x: int) -> tuple[str, str, float, float]:
    model = MegatronThroughput(cost.cluster)
    old = model.curve(demand, np.array([demand.old_workers]))
    moves = cost.transitions(demand, old, model.curve(demand, np.array([x])))
    kind, source = KINDS[moves.kind[0]].value, SOURCES[moves.source[0]].value
    return kind, source, float(moves.downtime_s[0]), float(moves.lost_s[0])


def test_state_comes_from_the_nearest_copy() -> None:
    cost = ModelledDowntime(A100)
    running = JobDemand("j", 1.0, 8, 64, 32, shape=GPT_13B, global_batch=1024, world_size=32)
    kind, source, grow_s, lost = costs(running, cost, 64)
    assert (kind, source, lost) == ("grow", "peer", 0.0)  # a data-parallel replica has it
    shrink = costs(running, cost, 16)
    assert shrink[:2] == ("shrink", "none") and shrink[2] < grow_s  # survivors keep theirs
    # One replica only, and a fault hit it: the state comes from the last checkpoint, and the
    # steps since it are done again.
    alone = JobDemand(
        "j", 1.0, 8, 8, 8, hit=True, shape=GPT_30B, global_batch=1024, world_size=8,
        recovery="restart", checkpoint_every=100,
    )  # fmt: skip
    kind, source, disk_s, lost = costs(alone, cost, 8)
    assert (kind, source) == ("restart", "disk")
    assert disk_s > A100.launch_s and lost > 0


def test_a_warm_spare_takes_a_restarts_seat_where_the_preset_measured_one() -> None:
    restart = JobDemand("j", 1.0, 1, 4, 4, hit=True, world_size=4, recovery="restart")
    with_spare = costs(restart, ModelledDowntime(CPU), 4)
    no_spare = costs(restart, ModelledDowntime(replace(CPU, spare_s=None)), 4)
    assert CPU.spare_s is not None
    assert no_spare[2] - with_spare[2] == pytest.approx(CPU.launch_s - CPU.spare_s)
    # Replacing a whole lost node's ranks is a fresh launch either way.
    lost = JobDemand("j", 1.0, 1, 4, 3, hit=True, world_size=4)
    assert costs(lost, ModelledDowntime(CPU), 4)[:2] == ("migrate", "peer")
    assert costs(lost, ModelledDowntime(CPU), 4)[2] > CPU.launch_s


def test_measured_factors_scale_the_downtime_not_the_redone_work() -> None:
    demand = JobDemand("j", 1.0, 1, 4, 2, hit=True, world_size=2, recovery="restart")
    plain = costs(demand, ModelledDowntime(CPU), 2)
    measured = ModelledDowntime(CPU).calibrated({TransitionKind.RESTART: 3.0})
    slow = costs(demand, measured, 2)
    assert slow[2] == pytest.approx(3 * plain[2])
    assert slow[3] == plain[3]
    keep = JobDemand("j", 1.0, 1, 4, 2, world_size=2)
    assert costs(keep, measured, 2)[2:] == (0.0, 0.0)  # no change costs nothing


def test_sources_name_every_state_source() -> None:
    assert {s.value for s in SOURCES} == {s.value for s in StateSource}
