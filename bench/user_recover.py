"""The user-script recovery rows of :mod:`bench.recover` (issue 10): one workload
(:mod:`bench.user_job`), a SIGKILLed rank, fault → next completed step, three ways:

- the script on ``unicron.train`` (:mod:`bench.user_api`) as a Unicron entrypoint job: healed in
  place (survivors park, a warm spare joins with a peer's state), measured from the events like
  the GPT rows (:mod:`bench.crash`);
- the unmodified DDP script (:mod:`bench.user_ddp`) as a Unicron entrypoint job: restart
  semantics (every rank restarts and resumes from the script's own checkpoint), measured from
  the script's markers;
- the same unmodified script under ``torchrun --max-restarts=3``, from the same markers.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from bench.crash import crash_trials, spares_ready
from bench.harness import BenchCluster, median
from bench.torchrun_recover import MarkerLog, kill_trial, torchrun_crashes
from bench.trials import Series, progress
from bench.user_job import JOB_FIELDS

REPO = Path(__file__).resolve().parents[1]


async def _submit(cluster: BenchCluster, name: str, module: str, **fields: Any) -> str:
    return await cluster.submit(
        name=name, entrypoint=["python", "-m", module], working_dir=str(REPO),
        **JOB_FIELDS, **fields,
    )  # fmt: skip


async def _cancel(cluster: BenchCluster, job_id: str) -> None:
    """Cancel and wait until its workers are gone, so the next job gets every slot."""
    await cluster.api.post(f"/v1/jobs/{job_id}/cancel")
    async with asyncio.timeout(60):
        while True:
            workers = (await cluster.job(job_id))["workers"]
            if not any(w["state"] == "RUNNING" for w in workers):
                return
            await asyncio.sleep(0.1)


async def api_script_trials(cluster: BenchCluster, trials: int) -> Series:
    job_id = await _submit(cluster, "user-api", "bench.user_api")
    series = await crash_trials(cluster, job_id, trials, name="unicron API script crash")
    await _cancel(cluster, job_id)
    return series


async def plain_script_trials(cluster: BenchCluster, trials: int) -> Series:
    series = Series("unicron plain script crash")
    with tempfile.TemporaryDirectory(prefix="user-ddp-") as tmp:
        markers = Path(tmp) / "markers.jsonl"
        env = {"BENCH_MARKERS": str(markers), "BENCH_CHECKPOINT_EVERY": "10"}
        job_id = await _submit(cluster, "user-ddp", "bench.user_ddp", env=env)
        log = MarkerLog(markers)
        restart = 0  # TORCHELASTIC_RESTART_COUNT of the first generation
        for _ in range(trials):
            # steady state: a warm spare for each of a node's ranks (the default, one per slot),
            # since every rank of the job restarts
            if not await spares_ready(cluster, per_node=None):
                series.notes.append("a node had fewer warm spares than slots at the fault")
            trial, restart = await asyncio.to_thread(kill_trial, log, restart, "restart")
            series.trials.append(trial)
            progress(series)
        await _cancel(cluster, job_id)
    return series


async def user_script_rows(
    cluster: BenchCluster, trials: int
) -> tuple[list[Series], dict[str, Any]]:
    """The three rows and their JSON fields."""
    api = await api_script_trials(cluster, trials)
    plain = await plain_script_trials(cluster, trials)
    torchrun = await asyncio.to_thread(
        torchrun_crashes, trials, "bench.user_ddp", "torchrun plain script crash"
    )
    baseline = median(torchrun.recover())

    def ratio(series: Series) -> float | None:
        own = median(series.recover())
        return round(baseline / own, 2) if own > 0 else None

    return [api, plain, torchrun], {
        "api_crash_s_p50": round(median(api.recover()), 3),
        "entrypoint_crash_s_p50": round(median(plain.recover()), 3),
        "torchrun_user_crash_s_p50": round(baseline, 3),
        "api_ratio_p50": ratio(api),
        "api_lost_steps_max": max((t.lost_steps for t in api.trials), default=0),
        "entrypoint_ratio_p50": ratio(plain),
        "entrypoint_lost_steps_max": max((t.lost_steps for t in plain.trials), default=0),
        "torchrun_user_lost_steps_max": max((t.lost_steps for t in torchrun.trials), default=0),
    }
