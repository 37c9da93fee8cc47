"""Calibration against real processes: the simulated downtime of a worker crash on the
4-worker CPU job (2 agents x 2 slots, the reference trainer's model, as ``bench/detect.py``
runs it), to compare with what a recovery benchmark measures on real processes.

The simulator prices transitions with the planner's own cost model, scaled by the same
per-kind factors (measured / modelled downtime) that the planner's calibration store learns
from the executor's measurements; pass them with ``--calibration FILE`` (see
:func:`simulator.inputs.load_calibration`) and both use the same numbers. The ratio printed here
is simulated / measured: 1 means the model needs no factor; its inverse is the ``restart``
factor to feed back.

    python bench/recover.py --trials 5 | tail -1 > recover.json
    python -m simulator.calibrate --recover-json recover.json [--calibration calib.json]

(or ``--measured SECONDS``); ``bench/recover.py``'s ``unicron_crash_s_p50`` is the measurement.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from services.planner.api import Calibration, TransitionKind
from shared.taxonomy import FailureCategory
from simulator.inputs import ClusterConfig, JobConfig, load_calibration
from simulator.runner import Scenario, run_policy
from simulator.trace import Failure

CPU_CLUSTER = ClusterConfig(nodes=2, gpus_per_node=2, gpu="cpu")
CPU_JOB = JobConfig("cpu-4", params_b=0.001, weight=1.0, min_gpus=2, max_gpus=4)
CRASH_AT_S = 60.0


def simulated_crash_downtime(calibration: Calibration | None = None) -> float:
    """Seconds the 4-worker CPU job is down after one worker exits abnormally (SEV2)."""
    crash = Failure(CRASH_AT_S, 0, FailureCategory.EXITED_ABNORMALLY, 0.0)
    calib = calibration or Calibration(failure_rate_per_gpu_h=1e-3)
    scenario = Scenario(CPU_CLUSTER, [CPU_JOB], [crash], 2 * CRASH_AT_S, CRASH_AT_S, calib)
    return float(run_policy(scenario, "unicron").summary["downtime_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=float, help="measured crash downtime, seconds")
    parser.add_argument("--recover-json", type=Path, help="bench/recover.py's JSON line")
    parser.add_argument("--calibration", type=Path, help="planner calibration JSON")
    args = parser.parse_args()
    if args.recover_json:
        args.measured = float(json.loads(args.recover_json.read_text())["unicron_crash_s_p50"])
    calib = None
    if args.calibration:
        factors, rate = load_calibration(args.calibration)
        calib = Calibration(
            transition_factors=tuple(sorted((TransitionKind(k), v) for k, v in factors.items())),
            failure_rate_per_gpu_h=rate or 1e-3,
        )
    simulated = simulated_crash_downtime(calib)
    report: dict[str, float | None] = {"simulated_s": round(simulated, 3)}
    if args.measured:
        report["measured_s"] = args.measured
        report["ratio_simulated_to_measured"] = round(simulated / args.measured, 3)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
