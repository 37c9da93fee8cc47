"""Online calibration, kept in Redis so any planner instance can rebuild it after a restart.

Three estimates, each updated from what the cluster reports and read back as one
:class:`~unicron.planning.api.Calibration` per planning pass:

- per job, ``slowdown``: an EWMA of observed over modelled iteration time (rank 0's step
  reports, the first step of each generation left out as warm-up), dividing T(t, x);
- per transition kind, ``factor``: an EWMA of the downtime the executor measured over the
  downtime the plan predicted before calibration, multiplying D_trans;
- the failure rate per GPU-hour: (prior rate · prior GPU-hours + failures) / (prior GPU-hours
  + GPU-hours run), both counts halving every ``half_life_h`` so the estimate follows the
  cluster as it is now. D_run = 1 / (rate · GPUs).

Values are rounded to two significant digits when read, so noise in the last digits does not
make every reconcile pass a new planning problem. Only the active planner writes (it holds the
lease), so the read-modify-write updates need no transaction. Each planning pass also stores
what it read as a :class:`~unicron.shared.contracts.calibration.CalibrationRecord`, the form the API
exports and the simulator imports (:mod:`unicron.planning.calibration` converts it both ways).
"""

from __future__ import annotations

from dataclasses import dataclass

from unicron.planning.api import Calibration, TransitionKind
from unicron.planning.calibration import record_of
from unicron.shared.contracts.models import now
from unicron.shared.store.calibstore import JOB_TABLE, TRANSITION_TABLE, CalibrationTables

CLAMP = (0.05, 20.0)  # a factor outside this is a broken measurement, not a slow cluster


def ewma(old: float | None, sample: float, alpha: float) -> float:
    return sample if old is None else (1 - alpha) * old + alpha * sample


def two_digits(value: float) -> float:
    return float(f"{value:.2g}")


def clamp(value: float) -> float:
    return min(max(value, CLAMP[0]), CLAMP[1])


@dataclass(frozen=True)
class FailurePrior:
    rate_per_gpu_h: float
    gpu_h: float
    half_life_h: float


class CalibrationStore:
    def __init__(self, tables: CalibrationTables, prior: FailurePrior, alpha: float = 0.2) -> None:
        self.tables = tables  # StateStore.calibration
        self.prior = prior
        self.alpha = alpha

    async def job_steps(self, job_id: str, ratio: float, samples: int, at: float) -> float:
        """Fold ``samples`` steps whose mean observed/modelled time is ``ratio``; new slowdown."""
        record = await self.tables.record(JOB_TABLE, job_id)
        weight = 1 - (1 - self.alpha) ** samples  # as if folded in one at a time
        slowdown = clamp(ewma(record.get("slowdown"), ratio, weight))
        count = int(record.get("samples", 0)) + samples
        await self.tables.put_record(
            JOB_TABLE, job_id, {"slowdown": slowdown, "samples": count, "at": at}
        )
        return slowdown

    async def forget_job(self, job_id: str) -> None:
        await self.tables.drop_record(JOB_TABLE, job_id)

    async def transition(self, kind: TransitionKind, observed_s: float, modelled_s: float) -> float:
        """Fold one measured transition of ``kind``; the new factor."""
        record = await self.tables.record(TRANSITION_TABLE, kind.value)
        factor = clamp(ewma(record.get("factor"), observed_s / modelled_s, self.alpha))
        update = {
            "factor": factor,
            "samples": int(record.get("samples", 0)) + 1,
            "last_observed_s": observed_s,
            "last_modelled_s": modelled_s,
        }
        await self.tables.put_record(TRANSITION_TABLE, kind.value, update)
        return factor

    async def _failures(self, at: float, failures: float, gpu_h: float) -> None:
        state = await self.tables.failure_counts()
        elapsed_h = max(0.0, at - state.get("at", at)) / 3600
        decay = 0.5 ** (elapsed_h / self.prior.half_life_h)
        updated = {
            "failures": state.get("failures", 0.0) * decay + failures,
            "gpu_h": state.get("gpu_h", 0.0) * decay + gpu_h,
            "at": at,
        }
        await self.tables.put_failure_counts(updated)

    async def failure(self, at: float) -> None:
        await self._failures(at, 1.0, 0.0)

    async def exposure(self, gpus: int, at: float, max_gap_s: float = 3600.0) -> None:
        """Count the GPU-hours run since the last call (capped: a long silence is no data)."""
        last = (await self.tables.failure_counts()).get("at")
        gap = min(max(0.0, at - last), max_gap_s) if last is not None else 0.0
        await self._failures(at, 0.0, gpus * gap / 3600)

    def rate(self, failures: float, gpu_h: float) -> float:
        prior = self.prior
        return (prior.rate_per_gpu_h * prior.gpu_h + failures) / (prior.gpu_h + gpu_h)

    async def load(self) -> Calibration:
        """Everything measured so far, rounded (see the module docstring)."""
        return (await self._read())[0]

    async def snapshot(self) -> Calibration:
        """:meth:`load`, also stored as the record the API exports (planning passes call this)."""
        calibration, samples = await self._read()
        record = record_of(calibration, samples, at=now())
        await self.tables.save_snapshot(record)
        return calibration

    async def _read(self) -> tuple[Calibration, dict[str, int]]:
        """The calibration, and how many measured transitions each kind's factor folds in."""
        jobs = await self.tables.records(JOB_TABLE)
        kinds = await self.tables.records(TRANSITION_TABLE)
        samples = {k: int(v.get("samples", 0)) for k, v in kinds.items()}
        slowdown = sorted((j, two_digits(v["slowdown"])) for j, v in jobs.items())
        factors = sorted(
            (TransitionKind(k), two_digits(v["factor"]))
            for k, v in kinds.items()
            if k in TransitionKind._value2member_map_
        )
        counts = await self.tables.failure_counts()
        rate = self.rate(counts.get("failures", 0.0), counts.get("gpu_h", 0.0))
        return Calibration(tuple(slowdown), tuple(factors), two_digits(rate)), samples
