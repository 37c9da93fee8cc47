"""``unicron plan``: the latest plan, or one by id, and ``--explain`` with the alternatives."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import typer
from fastapi import FastAPI
from typer.testing import CliRunner, Result
from unicron.cli.plan import plan as plan_command
from unicron.cli.render import clock
from unicron.planning.api import Calibration
from unicron.planning.fairness import PlanRules, TenantQuotas
from unicron.planning.planning import plan_cluster, snapshot
from unicron.services.api.app import create_app
from unicron.services.api.routes import plans
from unicron.services.api.settings import ApiSettings
from unicron.services.planner.settings import PlannerSettings
from unicron.shared.contracts.models import (
    FailureRecord,
    HistoryEntry,
    Job,
    JobSpec,
    JobState,
    ModelConfig,
    NodeRecord,
    WorkerRecord,
    WorkerState,
    now,
)
from unicron.shared.contracts.plans import Plan
from unicron.shared.store.state import StateStore

from tests.api import live

runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})
GPT_7B = ModelConfig(n_layer=32, n_head=32, d_model=4096, seq_len=2048, vocab=51200)
GPT_1B = ModelConfig(n_layer=24, n_head=16, d_model=2048, seq_len=2048, vocab=51200)


@pytest.fixture(autouse=True)
def plans_router(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Serve the plans router even before ``services/api/app.py`` registers it."""

    def create(settings: ApiSettings | None = None) -> FastAPI:
        app = create_app(settings)
        if not any(getattr(r, "path", "").startswith("/v1/plans") for r in app.routes):
            app.include_router(plans.router)
        return app

    monkeypatch.setattr(live, "create_app", create)
    yield


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(plan_command)
    app.callback()(lambda: None)  # keeps ``plan`` a subcommand, as in ``unicron plan``
    return app


async def unicron(*args: str, api_url: str) -> Result:
    async with asyncio.timeout(30):
        return await asyncio.to_thread(lambda: runner.invoke(cli(), [*args, "--api", api_url]))


def gpu_cluster() -> tuple[list[NodeRecord], list[Job]]:
    """Four A100 nodes; a 7B job hit by a fault on two of them; a 1.3B job waiting."""
    at = now()
    nodes = [NodeRecord(id=f"node-{i}", slots=8, last_heartbeat=at) for i in range(4)]
    ranks = ["node-0"] * 8 + ["node-1"] * 8
    failure = FailureRecord(
        failure_id="fail-7", generation=1, kind="exception", category="cuda_error",
        severity="SEV2", action="restart", rank=3, node_id="node-0", observed_at=at,
    )  # fmt: skip
    hit = Job(
        id="job-1", name="gpt-7b", state=JobState.RUNNING, generation=1, world_size=16,
        spec=JobSpec(name="gpt-7b", min_workers=8, max_workers=32, global_batch=1024,
                     micro_batch=1, model=GPT_7B),
        workers=[WorkerRecord(rank=r, node_id=n, state=WorkerState.RUNNING)
                 for r, n in enumerate(ranks)],
        last_failure=failure, submitted_at=at - 10,
    )  # fmt: skip
    waiting = Job(
        id="job-2", name="gpt-1b", submitted_at=at - 5,
        spec=JobSpec(name="gpt-1b", min_workers=8, max_workers=16, global_batch=512,
                     micro_batch=1, model=GPT_1B, weight=2.0),
    )  # fmt: skip
    return nodes, [hit, waiting]


async def explained_plan(state: StateStore) -> Plan:
    nodes, jobs = gpu_cluster()
    calibration = Calibration(failure_rate_per_gpu_h=0.05)
    inputs = snapshot(nodes, jobs, now(), calibration)
    draft = plan_cluster(inputs, PlannerSettings(planner_cluster="a100").objective())
    plan = Plan(
        seq=7, epoch=2, trigger="failure.detected job-1", allocations=draft.allocations,
        free_slots=draft.free_slots, expected_waf=draft.expected_waf,
        expected_reward=draft.expected_reward, cluster="a100", unit_slots=draft.unit,
        run_s=draft.run_s, failure_rate_per_gpu_h=0.05, planning_ms=draft.planning_ms,
    )  # fmt: skip
    await state.save_plan(plan)
    return plan


async def test_no_plan_yet_is_refused_with_the_reason(api_url: str) -> None:
    result = await unicron("plan", "--explain", api_url=api_url)
    assert result.exit_code == 2
    assert "no plan yet" in result.output


async def test_plan_shows_each_job_and_explain_shows_why(api_url: str, state: StateStore) -> None:
    plan = await explained_plan(state)
    table = await unicron("plan", api_url=api_url)
    assert table.exit_code == 0, table.output
    assert plan.id in table.stdout and "epoch 2" in table.stdout
    assert "job-1" in table.stdout and "job-2" in table.stdout
    assert "restart" in table.stdout and "16 → " in table.stdout
    assert "FLOP/s" in table.stdout and "TP" in table.stdout

    explained = await unicron("plan", plan.id, "--explain", api_url=api_url)
    assert explained.exit_code == 0, explained.output
    out = explained.stdout
    assert "configuration" in out and "s/step" in out and "→" in out
    assert "state from" in out and "downtime" in out
    assert "alternatives that lost:" in out and "plan reward" in out and "short by" in out
    assert "D_run" in out and "failures 0.05/GPU-hour" in out
    print(out)  # the explanation, as a user sees it (shown with -s)

    missing = await unicron("plan", "plan-nope", api_url=api_url)
    assert missing.exit_code == 2 and "plan-nope" in missing.output


async def test_explain_says_why_a_job_waits_and_since_when(api_url: str, state: StateStore) -> None:
    """A low-weight job waiting 5 h behind a heavy one of its tenant (a quota for another)."""
    at = now()
    nodes = [NodeRecord(id=f"node-{i}", slots=8, last_heartbeat=at) for i in range(2)]
    heavy = Job(
        id="job-1", name="heavy", state=JobState.RUNNING, generation=1, world_size=16,
        spec=JobSpec(name="heavy", min_workers=8, max_workers=16, global_batch=512,
                     micro_batch=1, model=GPT_1B, weight=4.0),
        workers=[WorkerRecord(rank=r, node_id=f"node-{r // 8}", state=WorkerState.RUNNING)
                 for r in range(16)],
        submitted_at=at - 6 * 3600, tenant="team-b",
    )  # fmt: skip
    since = at - 5 * 3600
    light = Job(
        id="job-2", name="light", submitted_at=since, tenant="team-b",
        history=[HistoryEntry(at=since, state=JobState.PENDING, reason="submitted")],
        spec=JobSpec(name="light", min_workers=8, max_workers=8, global_batch=512,
                     micro_batch=1, model=GPT_1B, weight=0.5),
    )  # fmt: skip
    rules = PlanRules(quotas=TenantQuotas.parse({"team-c": 0}))
    inputs = snapshot(nodes, [heavy, light], at, rules=rules)
    draft = plan_cluster(inputs, PlannerSettings(planner_cluster="a100").objective(), rules)
    plan = Plan(seq=1, allocations=draft.allocations, free_slots=draft.free_slots,
                expected_reward=draft.expected_reward, run_s=draft.run_s,
                fairness=draft.fairness)  # fmt: skip
    await state.save_plan(plan)

    explained = await unicron("plan", "--explain", api_url=api_url)
    assert explained.exit_code == 0, explained.output
    out = " ".join(explained.stdout.split())  # rich wraps long lines
    assert f"waiting since {clock(since)} (5.0 h): lower value than the jobs that run" in out
    assert "on 8 workers it would add" in out and "in job-1 (16→8 workers)" in out
    assert "the best plan that starts it is short by" in out
    assert "fairness waf" in out
    print(explained.stdout)
