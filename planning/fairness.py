"""The rules the DP runs under besides Σ G (docs/design.md §4): a fairness policy against
starvation, and per-tenant GPU quotas.

Pure WAF maximisation starves jobs: a job whose weight x throughput per slot is below the
others' never runs while they do. A cluster chooses one :class:`Fairness`:

- ``waf``: Σ G alone.
- ``aging``: each job's G is multiplied by 1 + waited / ``aging_s``, ``waited`` being the time
  it has spent admitted without slots, so a job that waited ``aging_s`` counts twice. The time
  is counted up to the last whole ``aging_step_s`` of the clock, so weights (and plans) change
  at most once a step; and a running job keeps what it earned, so the job it displaced cannot
  take its slots straight back but has to wait steps of its own (no thrashing).
- ``guaranteed_min``: before WAF is maximised, every admitted job, in submission order, is
  given its minimum if that fits in the units left and in its tenant's quota; the DP then
  maximises Σ G over what is left.

Quotas (:class:`TenantQuotas`) cap the slots all of a tenant's jobs hold together; the DP
honours them exactly (:mod:`.quotas`). A job with no tenant (no API tokens in use) has none.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from unicron.shared.contracts.models import Job, JobState
from unicron.shared.contracts.plans import Fairness

# A tenant name as API tokens spell it (services/api/settings.py); "*" is every other tenant.
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ANY_TENANT = "*"


@dataclass(frozen=True)
class TenantQuotas:
    """Slots each named tenant's jobs may hold together; ``default`` for any other tenant
    (None: unlimited)."""

    slots: tuple[tuple[str, int], ...] = ()
    default: int | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, object]) -> TenantQuotas:
        """From ``{"team-a": 8, "*": 16}``; ValueError names the bad entry."""
        named: dict[str, int] = {}
        for tenant, quota in raw.items():
            if tenant != ANY_TENANT and not TENANT_NAME.match(tenant):
                raise ValueError(f"{tenant!r} is not a tenant name (or '*' for the others)")
            if isinstance(quota, bool) or not isinstance(quota, int):
                raise ValueError(f"{tenant!r}: quota must be a whole number of slots, not "
                                 f"{quota!r}")  # fmt: skip
            if quota < 0:
                raise ValueError(f"{tenant!r}: quota must be ≥ 0 slots, not {quota}")
            named[tenant] = quota
        default = named.pop(ANY_TENANT, None)
        return cls(tuple(sorted(named.items())), default)

    def of(self, tenant: str | None) -> int | None:
        if tenant is None:
            return None
        return dict(self.slots).get(tenant, self.default)

    def all(self) -> list[int]:
        return [q for _, q in self.slots] + ([self.default] if self.default is not None else [])


@dataclass(frozen=True)
class PlanRules:
    """The fairness policy and the quotas one planning pass applies."""

    fairness: Fairness = Fairness.WAF
    aging_s: float = 86400.0
    aging_step_s: float = 4 * 3600.0
    quotas: TenantQuotas = field(default_factory=TenantQuotas)

    def boundary(self, now: float) -> float:
        """The time up to which waiting counts: the last whole aging step of the clock."""
        return math.floor(now / self.aging_step_s) * self.aging_step_s

    def counted_wait(self, job: Job, now: float) -> float:
        """The waiting this policy counts for ``job`` (0 unless it ages), so that the inputs
        change only when a weight does."""
        if self.fairness != Fairness.AGING:
            return 0.0
        return waited_s(job, self.boundary(now))

    def weight_factor(self, waited: float) -> float:
        """What multiplies a job's weight (so its G) after ``waited`` counted seconds."""
        return 1.0 + waited / self.aging_s if self.fairness == Fairness.AGING else 1.0


def _spells(job: Job) -> list[tuple[float, JobState]]:
    """(since, state) of each state the job has been in, oldest first."""
    spells = [(e.at, e.state) for e in job.history]
    if not spells or spells[0][1] != JobState.PENDING:
        spells.insert(0, (job.submitted_at, JobState.PENDING))
    return sorted(spells, key=lambda s: s[0])


def waiting_since(job: Job) -> float | None:
    """When a PENDING job last became PENDING (submitted, or preempted); None otherwise."""
    if job.state != JobState.PENDING:
        return None
    since = [at for at, state in _spells(job) if state == JobState.PENDING]
    return since[-1]


def waited_s(job: Job, until: float) -> float:
    """Seconds the job spent PENDING (admitted, holding no slots) before ``until``."""
    spells = _spells(job)
    ends = [at for at, _ in spells[1:]] + [until]
    return sum(
        max(0.0, min(end, until) - start)
        for (start, state), end in zip(spells, ends, strict=True)
        if state == JobState.PENDING
    )
