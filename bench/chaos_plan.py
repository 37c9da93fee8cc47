"""The seeded schedule of a chaos run (:mod:`bench.chaos`): the lanes of concurrent jobs, each
lane's faults, and the kills and restarts, each tied to one fault.

A lane keeps one job running at a time: when its job nears its last step, the lane's next
faults go to a fresh job of the same spec. The run's length then follows the machine's speed
(how fast workers step and warm spares come back) instead of a step count guessed in advance,
and every job of a workload has one spec, so one failure-free reference run per workload
covers them all.

Everything here is a pure function of the seed and the sizes, so two runs with one seed inject
the same faults (lane, kind, rank, the steps each waits after the previous recovery, their
order) and do the same kills after the same faults. Only wall-clock timing differs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unicron.shared.contracts.messages import FaultKind

from bench.detect import EXCEPTIONS

REPO = Path(__file__).resolve().parents[1]
# Every kind that ends in a failure; ``slow`` is advisory (a straggler notice, no recovery).
FAILING_KINDS = (FaultKind.CRASH, FaultKind.EXIT, FaultKind.EXCEPTION, FaultKind.HANG)
# Exceptions of SEV2/SEV3 families (SEV1 texts would isolate the node like real hardware does).
EXCEPTION_TEXTS = tuple(EXCEPTIONS[k][0] for k in ("illegal_memory", "cuda", "oom", "network"))
EXIT_CODES = (1, 2, 3, 42)  # 1 is the API's default for an ``exit`` drill
CONTROL_PLANE = ("api", "detector", "planner", "executor")
INFRA = ("nats-server", "redis-server")
# With --ha (``unicron up --ha``): one server of the 3-server NATS cluster is killed, and the
# Redis primary, whichever server that is by then, so that the Sentinels fail over.
NATS_CLUSTER = 3
REDIS_PRIMARY = "redis-primary"
WORLD = 2  # workers per job; a node has as many slots
TINY_GPT = {"n_layer": 1, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab": 32}
WORKLOADS = ("gpt", "script")  # the built-in trainer; bench.user_api on unicron.train


def is_infra(target: str) -> bool:
    """Whether ``target`` is a server (NATS or Redis), not a service or an agent."""
    return target in INFRA or target == REDIS_PRIMARY or target.startswith("nats-")


@dataclass(frozen=True)
class FaultPlan:
    lane: int
    order: int  # its place among the lane's faults
    kind: FaultKind
    rank: int
    gap: int  # steps the job trains after its previous recovery (or start) before this fault

    def body(self, seed: int) -> dict[str, Any]:
        """The ``POST /v1/jobs/{id}/faults`` body; ``seed`` picks the exit code or text."""
        body: dict[str, Any] = {"rank": self.rank, "kind": self.kind.value}
        pick = random.Random(f"{seed}:{self.lane}:{self.order}")
        if self.kind == FaultKind.EXIT:
            body["exit_code"] = pick.choice(EXIT_CODES)
        elif self.kind == FaultKind.EXCEPTION:
            body["message"] = pick.choice(EXCEPTION_TEXTS)
        return body


@dataclass(frozen=True)
class ActionPlan:
    """kill -9 of ``target`` (a stack child or embedded server) ``delay_s`` after the fault
    ``(lane, order)`` was injected; it is started again ``down_s`` later."""

    target: str
    lane: int
    order: int
    delay_s: float
    down_s: float

    @property
    def quiet(self) -> bool:
        """An agent kill takes its node's workers with it: it waits for a quiet cluster so that
        the failures it causes are not confused with those of the injected faults."""
        return self.target.startswith("agent-")


@dataclass(frozen=True)
class ChaosPlan:
    seed: int
    nodes: int
    lanes: int
    steps: int  # of every job
    faults: list[FaultPlan]
    actions: list[ActionPlan]
    ha: bool = False  # on ``unicron up --ha``'s servers

    def faults_of(self, lane: int) -> list[FaultPlan]:
        return [f for f in self.faults if f.lane == lane]

    @staticmethod
    def workload(lane: int) -> str:
        return WORKLOADS[lane % len(WORKLOADS)]

    def spec(self, workload: str, name: str) -> dict[str, Any]:
        """Every job of ``workload`` has this spec; only the name differs."""
        common = {
            "name": name, "steps": self.steps, "min_workers": WORLD, "max_workers": WORLD,
            "checkpoint_every": 50, "seed": self.seed,
        }  # fmt: skip
        if workload == "gpt":
            return common | {"global_batch": 8, "micro_batch": 2, "model": TINY_GPT}
        return common | {
            "global_batch": 16, "micro_batch": 4, "working_dir": str(REPO),
            "entrypoint": ["python", "-m", "bench.user_api"],
        }  # fmt: skip


def _faults(rng: random.Random, total: int, lanes: int) -> list[FaultPlan]:
    kinds = [FAILING_KINDS[i % len(FAILING_KINDS)] for i in range(total)]
    rng.shuffle(kinds)
    faults: list[FaultPlan] = []
    for index, kind in enumerate(kinds):
        lane = index % lanes
        order = sum(f.lane == lane for f in faults)
        faults.append(FaultPlan(lane, order, kind, rng.randrange(WORLD), rng.randint(20, 80)))
    return faults


def _actions(rng: random.Random, targets: list[str], faults: list[FaultPlan]) -> list[ActionPlan]:
    # Not after a lane's first fault (the cluster is still warming up), and never two actions
    # after one fault.
    slots = [f for f in faults if f.order > 0] or list(faults)
    chosen = rng.sample(slots, min(len(targets), len(slots)))
    actions = []
    for target, fault in zip(targets, chosen, strict=False):
        if target.startswith("agent-"):
            down = rng.uniform(1.0, 3.0)
        elif is_infra(target):
            down = rng.uniform(0.5, 2.0)
        else:  # ``unicron up`` notices an exit within its 0.5-s supervision interval
            down = rng.uniform(0.1, 0.6)
        actions.append(ActionPlan(target, fault.lane, fault.order, rng.uniform(0.0, 0.5), down))
    return actions


def make_plan(seed: int, faults: int, lanes: int, quick: bool, ha: bool = False) -> ChaosPlan:
    """The run's schedule; ``quick``: one control-plane kill and a Redis restart (with ``ha``:
    a NATS server kill and a Redis failover), no agent."""
    if faults < 1 or lanes < 1:
        raise ValueError("a chaos run needs at least one fault and one job")
    rng = random.Random(seed)
    fault_plans = _faults(rng, faults, lanes)
    nodes = max(lanes, 2)
    infra = [f"nats-{rng.randrange(NATS_CLUSTER)}", REDIS_PRIMARY] if ha else list(INFRA)
    if quick:
        targets = [rng.choice(CONTROL_PLANE), *(infra if ha else ["redis-server"])]
    else:
        targets = [*CONTROL_PLANE, *infra, f"agent-node-{rng.randrange(nodes)}"]
    rng.shuffle(targets)
    # A job takes a fault about every 400 steps here (a warm spare comes back in ~15 s on a
    # busy 2-core machine); the last 300 steps take none (see chaos_drive.END_MARGIN_STEPS).
    steps = 1000 if quick else 2000
    actions = _actions(rng, targets, fault_plans)
    return ChaosPlan(seed, nodes, lanes, steps, fault_plans, actions, ha)
