"""Recovery policies, one module each, registered by name.

``unicron`` (:mod:`.unicron`), ``restart`` (Megatron-LM default restart, :mod:`.restart`),
``oobleck`` (:mod:`.oobleck`), ``varuna`` (:mod:`.varuna`), ``bamboo`` (:mod:`.bamboo`). Each
module's docstring gives the mechanism and the published figures its numbers come from.
"""

from __future__ import annotations

from collections.abc import Callable

from unicron.planning.api import Calibration
from unicron.planning.fairness import PlanRules
from unicron.simulator.policies.bamboo import Bamboo
from unicron.simulator.policies.base import Policy
from unicron.simulator.policies.oobleck import Oobleck
from unicron.simulator.policies.restart import Restart
from unicron.simulator.policies.unicron import Unicron
from unicron.simulator.policies.varuna import Varuna

BASELINES = ("restart", "oobleck", "varuna", "bamboo")
NAMES = ("unicron", *BASELINES)


def make_policy(
    name: str,
    calibration: Calibration,
    measured_plan_time: bool = False,
    baseline_allocation: str = "planner",
    rules: PlanRules | None = None,
) -> Policy:
    """A fresh policy object (policies keep per-run state); ``baseline_allocation`` is how the
    baselines split the cluster at the start: "planner" (Unicron's plan under ``rules``, the
    planner's fairness policy and quotas) or "fifo"."""
    alloc, plan = baseline_allocation, rules or PlanRules()
    factories: dict[str, Callable[[], Policy]] = {
        "unicron": lambda: Unicron(calibration, measured=measured_plan_time, rules=plan),
        "restart": lambda: Restart(alloc, plan),
        "oobleck": lambda: Oobleck(alloc, plan),
        "varuna": lambda: Varuna(alloc, plan),
        "bamboo": lambda: Bamboo(alloc, plan),
    }
    if name not in factories:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(NAMES)}, all")
    return factories[name]()


__all__ = ["BASELINES", "NAMES", "Policy", "make_policy"]
