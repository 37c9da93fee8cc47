"""Calibration against real processes: the simulated downtime of a worker crash on the
4-worker CPU job (2 agents x 2 slots, the reference trainer's model, as ``bench/detect.py``
runs it), to compare with what a recovery benchmark measures on real processes.

The simulator prices transitions with the planner's own cost model, scaled by the same
per-kind factors (measured / modelled downtime) that the planner's calibration store learns
from the executor's measurements. ``bench/recover.py`` ends by saving what the planner learnt
from its trials (``GET /v1/calibration``) in its JSON line; given that line, this prints the
simulated crash downtime without and with those factors, each against the measured one
(simulated / measured: 1 is a perfect model). ``--calibration FILE`` takes the same record from
``unicron calibration --out FILE`` instead. The failure rate is pinned at 1e-3 per GPU-hour: a
bench's bursts of deliberate faults say nothing about D_run.

    python bench/recover.py --trials 5 | tail -1 > recover.json
    python -m unicron.simulator.calibrate --recover-json recover.json

(or ``--measured SECONDS``); ``bench/recover.py``'s ``unicron_crash_s_p50`` is the measurement.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from unicron.planning.api import Calibration, TransitionKind
from unicron.planning.calibration import calibration_of
from unicron.shared.contracts.calibration import CalibrationRecord
from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.simulator.inputs import ClusterConfig, InputError, JobConfig, load_calibration
from unicron.simulator.runner import Scenario, run_policy
from unicron.simulator.trace import Failure

CPU_CLUSTER = ClusterConfig(nodes=2, gpus_per_node=2, gpu="cpu")
CPU_JOB = JobConfig("cpu-4", params_b=0.001, weight=1.0, min_gpus=2, max_gpus=4)
CRASH_AT_S = 60.0


def simulated_crash_downtime(calibration: Calibration | None = None) -> float:
    """Seconds the 4-worker CPU job is down after one worker exits abnormally (SEV2)."""
    crash = Failure(CRASH_AT_S, 0, FailureCategory.EXITED_ABNORMALLY, 0.0)
    calib = replace(calibration or Calibration(), failure_rate_per_gpu_h=1e-3)
    scenario = Scenario(CPU_CLUSTER, [CPU_JOB], [crash], 2 * CRASH_AT_S, CRASH_AT_S, calib)
    return float(run_policy(scenario, "unicron").summary["downtime_s"])


def _from_recover_json(path: Path) -> tuple[float, Calibration | None]:
    """Measured crash downtime and the planner's calibration from ``bench/recover.py``'s line."""
    try:
        raw = json.loads(path.read_text().strip().splitlines()[-1])
        measured = float(raw["unicron_crash_s_p50"])
    except (OSError, IndexError, ValueError, KeyError) as exc:
        raise SystemExit(f"{path}: not bench/recover.py's JSON line ({exc!r})") from exc
    record = raw.get("calibration")
    return measured, calibration_of(CalibrationRecord.model_validate(record)) if record else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=float, help="measured crash downtime, seconds")
    parser.add_argument("--recover-json", type=Path, help="bench/recover.py's JSON line")
    parser.add_argument("--calibration", type=Path, help="planner calibration JSON")
    args = parser.parse_args()
    measured, calib = args.measured, None
    if args.recover_json:
        measured, calib = _from_recover_json(args.recover_json)
    if args.calibration:
        try:
            calib = load_calibration(args.calibration)
        except InputError as exc:
            raise SystemExit(str(exc)) from exc
    report: dict[str, Any] = {"simulated_uncalibrated_s": round(simulated_crash_downtime(), 3)}
    if calib is not None:
        report["restart_factor"] = dict(calib.transition_factors).get(TransitionKind.RESTART)
        report["simulated_calibrated_s"] = round(simulated_crash_downtime(calib), 3)
    if measured:
        report["measured_s"] = measured
        for key in ("uncalibrated", "calibrated"):
            if f"simulated_{key}_s" in report:
                ratio = report[f"simulated_{key}_s"] / measured
                report[f"ratio_{key}_to_measured"] = round(ratio, 3)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
