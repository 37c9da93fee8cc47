"""The calibration's pure side: its exported record converted both ways, and the prior rate.

The service learns the calibration online and keeps it in Redis
(``unicron.services.planner.calibration``); each planning pass stores what it read as a
:class:`~unicron.shared.contracts.calibration.CalibrationRecord`, the form the API exports and the
simulator imports. :func:`record_of` and :func:`calibration_of` convert between that record and the
:class:`~unicron.planning.api.Calibration` the models consume.
"""

from __future__ import annotations

from unicron.planning.api import Calibration, TransitionKind
from unicron.shared.contracts.calibration import CalibrationRecord

# Llama 3 405B: 466 interruptions in 54 days on 16,384 H100 (docs/design.md §7).
LLAMA3_FAILURES_PER_GPU_H = 466 / (54 * 24 * 16384)


def record_of(
    calibration: Calibration, samples: dict[str, int] | None = None, at: float | None = None
) -> CalibrationRecord:
    return CalibrationRecord(
        transition_factors={kind.value: f for kind, f in calibration.transition_factors},
        transition_samples=samples or {},
        job_slowdown=dict(calibration.job_slowdown),
        failure_rate_per_gpu_h=calibration.failure_rate_per_gpu_h,
        at=at,
    )


def calibration_of(record: CalibrationRecord) -> Calibration:
    """The models' form of an exported record; ValueError names a kind the planner lacks."""
    known = TransitionKind._value2member_map_
    unknown = sorted(set(record.transition_factors) - set(known))
    if unknown:
        raise ValueError(
            f"transition_factors.{unknown[0]}: not a transition kind; known: {', '.join(known)}"
        )
    return Calibration(
        job_slowdown=tuple(sorted(record.job_slowdown.items())),
        transition_factors=tuple(
            sorted((TransitionKind(k), v) for k, v in record.transition_factors.items())
        ),
        failure_rate_per_gpu_h=record.failure_rate_per_gpu_h,
    )
