"""The command line, ``python -m bench.gpuprobe --device cuda|cpu --out PATH``: the scenarios in
their order, each under its minimum of the time budget, one table row per scenario as it ends,
then the whole table and, last, one JSON line with everything recorded (also in ``--out``)."""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable

import bench.gpuprobe
from bench.gpuprobe.basics import s0_versions, s1_duplicate, s1_two_ranks
from bench.gpuprobe.common import ABORT_APIS, Record, describe
from bench.gpuprobe.nonblocking import s6_nonblocking
from bench.gpuprobe.nvml import s8_nvml
from bench.gpuprobe.oom_step import s7_oom, s9_step
from bench.gpuprobe.peer_death import s2_peer_death, s3_abort
from bench.gpuprobe.probe import Probe
from bench.gpuprobe.regroup import s45_regroup
from bench.gpuprobe.worker import run_role

# A scenario: its key, what runs it, the budget it needs (s), why it needs CUDA (None: it doesn't).
Scenario = tuple[str, Callable[[Probe], Record], float, str | None]


def scenarios() -> list[Scenario]:
    """All scenarios, in the order they run."""
    cuda_only = "needs CUDA/NCCL: --device cpu is a control-flow dry run on gloo"
    found: list[Scenario] = [
        ("s0_versions", s0_versions, 10, None),
        ("s1_two_ranks_one_gpu", s1_two_ranks, 20, None),
        ("s1_duplicate_gpu", s1_duplicate, 15, cuda_only),
        ("s7_oom", s7_oom, 10, cuda_only),
        ("s8_nvml", s8_nvml, 5, "needs an NVIDIA GPU and pynvml"),
        ("s9_step_time", s9_step, 15, None),
    ]
    # The hanging setting (0) last among s2; the abort APIs least likely to be used
    # (pg.abort wraps backend.abort, shutdown may wait for the stuck kernel) at the end.
    for value in (None, "2", "3", "1", "0"):
        label = "unset" if value is None else value
        found.append(
            (f"s2_peer_death_aeh_{label}", functools.partial(s2_peer_death, aeh=value), 20, None)
        )
    found += [_abort(api) for api in ABORT_APIS[:2]]
    found += [
        ("s4_regroup_cold", functools.partial(s45_regroup, warm=False), 20, None),
        ("s5_regroup_warm", functools.partial(s45_regroup, warm=True), 20, None),
        ("s6_nonblocking_init_abort", s6_nonblocking, 15, None),
    ]
    found += [_abort(api) for api in ABORT_APIS[2:]]
    return found


def _abort(api: str) -> Scenario:
    return (f"s3_abort_{api}", functools.partial(s3_abort, api=api), 15, None)


def run(probe: Probe) -> None:
    """Run every scenario that is asked for, printing and writing as it goes."""
    import torch

    torch.set_num_threads(1)
    budget = round(probe.left())
    print(f"gpu_probe: device={probe.device} backend={probe.backend} budget={budget} s")
    print(f"gpu_probe: children's stderr in {probe.logs}", flush=True)
    for key, fn, minimum, cuda_reason in scenarios():
        if probe.only is not None and not any(key.startswith(o) for o in probe.only):
            continue
        if cuda_reason is not None and probe.device != "cuda":
            probe.results[key] = {"outcome": "skipped", "reason": cuda_reason}
        elif probe.left() < minimum:
            probe.results[key] = {
                "outcome": "skipped",
                "reason": f"probe budget spent ({probe.left():.0f} s left, needs {minimum})",
            }
        else:
            probe.results[key] = _run_one(probe, fn)
        row(key, probe.results[key])
        write(probe)
    probe.facts["finished_unix"] = time.time()
    write(probe)
    print()
    table(probe)
    print(json.dumps(probe.facts, default=str))


def _run_one(probe: Probe, fn: Callable[[Probe], Record]) -> Record:
    """One scenario's result, its children's records and its duration included."""
    start = time.monotonic()
    try:
        result = fn(probe)
    except Exception as exc:
        result = {"outcome": "probe error", "exc": describe(exc)}
    result["children"] = probe.reap()
    result["scenario_s"] = round(time.monotonic() - start, 3)
    return result


def write(probe: Probe) -> None:
    """The JSON so far, to ``--out``."""
    probe.out.parent.mkdir(parents=True, exist_ok=True)
    probe.out.write_text(json.dumps(probe.facts, indent=1, default=str))


def row(key: str, result: Record) -> None:
    """One scenario's table row."""
    text = f"{key:<40} {result.get('outcome', '?'):<28} {result.get('key', '')}"
    print(text, flush=True)


def table(probe: Probe) -> None:
    """The table of all scenarios recorded."""
    print(f"{'scenario':<40} {'outcome':<28} key figures")
    print("-" * 110)
    for key, result in probe.results.items():
        row(key, result)


def main() -> None:
    overview = bench.gpuprobe.__doc__
    description = overview.split("\n\n")[0] if overview else None
    parser = argparse.ArgumentParser(prog="python -m bench.gpuprobe", description=description)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", default="gpu_probe.json", help="where the JSON goes")
    parser.add_argument("--budget-s", type=float, default=285.0, help="whole-probe time limit")
    parser.add_argument("--pg-timeout-s", type=float, default=10.0, help="s2's group timeout")
    parser.add_argument("--only", default="", help="comma list of scenario key prefixes")
    parser.add_argument("--s2-wait-s", type=float, default=10.0, help="s2: wait past the timeout")
    parser.add_argument("--env", default="", help="KEY=VALUE,... set in every child")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--cfg", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_role(args.child, args.cfg)
        return
    probe = Probe(args)
    try:
        run(probe)
    finally:
        probe.reap()


if __name__ == "__main__":
    main()
