"""Why a plan gives a job no workers (``unicron plan --explain``), checked in this order:

1. no parallel configuration of its model runs on any count it allows;
2. its minimum is more than the usable slots (naming the nodes out of service, if any);
3. its minimum does not fit in what its tenant's quota leaves;
4. no plan under the rules can give it its minimum (the slots left after the guaranteed
   minimums of the jobs before it are too few);
5. it could run, but the slots it needs earn more where they are: the marginal comparison
   names the running job whose slots would cost the least to take (or "another tenant's
   job": a user never reads another tenant's job ids), and the exact shortfall of the best
   plan that starts it (from :func:`.quotas.alternatives`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np
from unicron.planning.allocation import Allocation, smallest
from unicron.planning.api import ClusterInputs
from unicron.planning.fairness import PlanRules
from unicron.planning.objective import JobTerms
from unicron.shared.contracts.plans import WaitReason

Why = tuple[WaitReason, str]
# A job of another tenant is never named to this one (as services/api/routes/plans.py says).
OTHERS_JOB = "(another tenant's job)"


class Donor(NamedTuple):
    """A running job that could give up units: how many workers it would keep, at what loss."""

    job: int  # row in the plan's jobs
    before: int
    after: int
    loss: float  # weighted FLOP/s


def scaled(value: float, unit: str) -> str:
    """A figure with an SI prefix: 2.1e15, "FLOP/s" → "2.1 PFLOP/s"."""
    for prefix, size in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(value) >= size:
            return f"{value / size:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


@dataclass(frozen=True)
class Waits:
    """What a waiting job's reason is read from: the cluster, the jobs' terms, the allocation."""

    inputs: ClusterInputs
    terms: Sequence[JobTerms]
    allocation: Allocation
    rules: PlanRules
    unit: int
    _cheapest_by_need: dict[int, Donor | None] = field(default_factory=dict, compare=False)

    @cached_property
    def units(self) -> int:
        return self.inputs.capacity // self.unit

    @cached_property
    def free(self) -> int:
        return self.units - sum(self.allocation.units)

    def why(self, i: int) -> Why:
        """The reason job ``i`` (given no units) waits."""
        terms = self.terms[i]
        d = terms.demand
        if d.min_workers > self.units * self.unit:
            return self._capacity(f"needs {d.min_workers} workers")
        lo = smallest(terms.rewards)
        if lo is None:
            return WaitReason.CANNOT_RUN, (
                f"no parallel configuration of its model runs on {d.min_workers} to "
                f"{min(d.max_workers, self.inputs.capacity)} workers"
            )
        needs = f"needs {terms.workers(lo)} workers"
        quota = self._quota(i, lo)
        if quota is not None:
            return WaitReason.TENANT_QUOTA, f"over its tenant's quota: {quota}, it {needs}"
        at = np.flatnonzero(self.allocation.ks[i] == lo)
        total = float(self.allocation.totals[i][at[0]]) if at.size else -np.inf
        free = self.free
        if not np.isfinite(total):
            held = sum(self.allocation.reserved) * self.unit
            return WaitReason.BELOW_MINIMUM, (
                f"below its minimum with the slots left: {free * self.unit} slots free and "
                f"the guaranteed minimums of earlier jobs hold {held}; it {needs}"
            )
        return WaitReason.LOWER_VALUE, self._value(i, lo, free, total)

    def _capacity(self, needs: str) -> Why:
        usable = self.inputs.capacity
        out = self.inputs.out_of_service
        if any(n.gpus for n in self.inputs.nodes):  # a user counts GPUs, not slots
            needs += " (one per GPU)"
        if not out:
            return WaitReason.CLUSTER_TOO_SMALL, f"{needs}, the cluster has {usable} slots"
        nodes = ", ".join(f"{n.node_id} {n.why}" for n in out)
        return WaitReason.NODES_UNAVAILABLE, (
            f"{needs}, {usable} slots usable; out of service: {nodes} "
            f"({sum(n.slots for n in out)} slots)"
        )

    def _quota(self, i: int, lo: int) -> str | None:
        """The quota's state when job ``i``'s minimum does not fit what it leaves."""
        cap, tenant = self.allocation.caps[i], self.inputs.jobs[i].tenant
        if cap is None:
            return None
        units = self.allocation.units
        mates = [j for j, v in enumerate(self.inputs.jobs) if v.tenant == tenant]
        held = sum(units[j] for j in mates)
        if lo <= cap - held:
            return None
        quota = self.rules.quotas.of(tenant)
        return f"tenant {tenant}'s jobs hold {held * self.unit} of its {quota} slots"

    def _value(self, i: int, lo: int, free: int, total: float) -> str:
        """The marginal comparison: what the job would add against what its slots earn."""
        terms, factor = self.terms[i], self.allocation.factors[i]
        gain = terms.demand.weight * factor * float(terms.curve.flops[lo])
        aged = f", aged x{factor:.2g}" if factor != 1.0 else ""
        text = (
            f"lower value than the jobs that run: on {terms.workers(lo)} workers it would add "
            f"{scaled(gain, 'FLOP/s')} of WAF (weight {terms.demand.weight:g}{aged})"
        )
        need = lo - free
        source = self._cheapest(need) if need > 0 else None
        if source is not None:
            text += (
                f", while the {need * self.unit} slots it lacks earn "
                f"{scaled(source.loss, 'FLOP/s')} in {self._name(source.job, i)} "
                f"({source.before}→{source.after} workers)"
            )
        short = self.allocation.total - total
        share = short / abs(self.allocation.total) if self.allocation.total else 0.0
        return text + f"; the best plan that starts it is short by {scaled(short, 'FLOP')} " \
            f"({share:.2%})"  # fmt: skip

    def _cheapest(self, need: int) -> Donor | None:
        """The running job that loses the least WAF giving up ``need`` units, and how."""
        if need not in self._cheapest_by_need:
            options = [d.giving(need) for d in self._donors]
            known = [o for o in options if o is not None]
            self._cheapest_by_need[need] = min(known, key=lambda o: o.loss) if known else None
        return self._cheapest_by_need[need]

    def _name(self, j: int, reader: int) -> str:
        """Job ``j``'s id, unless the reader (the waiting job's tenant) may not see it."""
        jobs = self.inputs.jobs
        mine = jobs[reader].tenant is None or jobs[j].tenant == jobs[reader].tenant
        return jobs[j].job_id if mine else OTHERS_JOB

    @cached_property
    def _donors(self) -> list[_Donor]:
        return [
            _Donor(j, terms, u, r, self.allocation.factors[j])
            for j, (terms, u, r) in enumerate(
                zip(self.terms, self.allocation.units, self.allocation.reserved, strict=True)
            )
            if u > 0
        ]


class _Donor:
    """A job that runs, and for each count c up to its own the best count ≤ c it could keep
    (above what the rules guarantee it): a running maximum of its throughput."""

    def __init__(self, job: int, terms: JobTerms, units: int, floor: int, factor: float) -> None:
        self.job, self.terms, self.units, self.factor = job, terms, units, factor
        at = np.arange(units + 1)
        runs = np.isfinite(terms.rewards[: units + 1]) & (at >= floor)
        flops = np.where(runs, terms.curve.flops[: units + 1], -np.inf)
        top = np.maximum.accumulate(flops)
        self.best = np.maximum.accumulate(np.where(runs & (flops == top), at, -1))

    def giving(self, need: int) -> Donor | None:
        if need > self.units or self.best[self.units - need] < 0:
            return None
        k, flops = int(self.best[self.units - need]), self.terms.curve.flops
        loss = self.terms.demand.weight * self.factor * float(flops[self.units] - flops[k])
        return Donor(self.job, self.terms.workers(self.units), self.terms.workers(k), loss)
