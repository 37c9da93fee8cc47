"""Calibration over REST and the CLI: the planner's measured factors, exported in the form the
simulator reads, so a simulation prices transitions with the numbers the planner uses."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from typer.testing import CliRunner
from unicron.cli.main import app
from unicron.planning.api import TransitionKind
from unicron.services.planner.calibration import CalibrationStore, FailurePrior
from unicron.shared.contracts.models import Job, JobSpec
from unicron.shared.store.state import StateStore
from unicron.simulator.inputs import load_calibration

from tests.api import live
from tests.api.factories import ADMIN, TOKENS, USER_A, bearer, says_not_found

PRIOR = FailurePrior(rate_per_gpu_h=1e-3, gpu_h=10.0, half_life_h=24.0)


async def measured(state: StateStore) -> CalibrationStore:
    """A planner's store after two measured restarts and some steps of two tenants' jobs."""
    store = CalibrationStore(state.calibration, PRIOR, alpha=0.5)
    for job_id, tenant in (("job-a", "team-a"), ("job-b", "team-b")):
        await state.create_job(
            Job(id=job_id, name=job_id, spec=JobSpec(name=job_id), tenant=tenant)
        )
        await store.job_steps(job_id, ratio=2.0, samples=5, at=1.0)
    await store.transition(TransitionKind.RESTART, observed_s=0.4, modelled_s=1.6)
    await store.transition(TransitionKind.RESTART, observed_s=0.4, modelled_s=1.6)
    await store.snapshot()  # what each planning pass does
    return store


async def test_no_snapshot_yet_is_a_404_that_says_so(client: httpx.AsyncClient) -> None:
    assert await says_not_found(client, "/v1/calibration", "no calibration yet")


async def test_export_feeds_the_simulator_the_planners_numbers(
    client: httpx.AsyncClient, state: StateStore, tmp_path: Path
) -> None:
    store = await measured(state)
    response = await client.get("/v1/calibration")
    assert response.status_code == 200
    record = response.json()
    assert record["transition_factors"] == {"restart": 0.25}
    assert record["transition_samples"] == {"restart": 2}
    assert record["job_slowdown"] == {"job-a": 2.0, "job-b": 2.0}
    saved = tmp_path / "calibration.json"
    saved.write_text(response.text)
    assert load_calibration(saved) == await store.load()


async def test_a_user_sees_only_its_tenants_job_slowdowns(
    nats_url: str, redis_url: str, state: StateStore
) -> None:
    await measured(state)
    with live.serve_api(nats_url, redis_url, api_tokens=TOKENS) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as http:
            assert (await http.get("/v1/calibration")).status_code == 401
            user = (await http.get("/v1/calibration", headers=bearer(USER_A))).json()
            admin = (await http.get("/v1/calibration", headers=bearer(ADMIN))).json()
    assert user["job_slowdown"] == {"job-a": 2.0}
    assert admin["job_slowdown"] == {"job-a": 2.0, "job-b": 2.0}
    assert user["transition_factors"] == admin["transition_factors"] == {"restart": 0.25}


async def test_cli_shows_and_saves_the_record(
    api_url: str, state: StateStore, tmp_path: Path
) -> None:
    await measured(state)
    out = tmp_path / "calib.json"
    runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})
    args = ["calibration", "--api", api_url, "--out", str(out)]
    result = await asyncio.to_thread(runner.invoke, app, args)
    assert result.exit_code == 0, result.output
    assert "transition restart" in result.output and "0.25" in result.output
    assert json.loads(out.read_text())["transition_factors"] == {"restart": 0.25}
    assert load_calibration(out).transition_factors == ((TransitionKind.RESTART, 0.25),)
