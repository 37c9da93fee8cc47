"""``unicron --output json``: every client command prints what it got as JSON a program can
parse (one document, or one per line for ``events`` and ``logs``), and keeps its exit codes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result
from unicron.cli.main import app
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.calibration import CALIBRATION_KEY, CalibrationRecord
from unicron.shared.contracts.messages import FaultAccepted
from unicron.shared.contracts.models import Job, JobState, JobSummary, NodeRecord, PlanAction
from unicron.shared.contracts.plans import JobAllocation, Plan
from unicron.shared.store.state import StateStore

from tests.api.factories import put_job
from tests.api.live import eventually
from tests.api.log_nodes import JOB, serve_nodes
from tests.client.moves import move

runner = CliRunner(env={"COLUMNS": "200", "UNICRON_API_TOKEN": None, "UNICRON_OUTPUT": None})


async def unicron_json(*args: str, api_url: str) -> Result:
    """``unicron --output json ARGS --api URL`` in a thread (the test's loop serves fixtures)."""
    argv = ["--output", "json", *args, "--api", api_url]
    async with asyncio.timeout(30):
        return await asyncio.to_thread(lambda: runner.invoke(app, argv))


def parsed(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def each_line(result: Result) -> list[Any]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


async def test_job_and_cluster_commands_print_json(
    api_url: str, state: StateStore, bus: Bus
) -> None:
    job = Job.model_validate(parsed(await unicron_json("submit", "--name", "j", api_url=api_url)))
    listed = parsed(await unicron_json("status", api_url=api_url))
    assert [JobSummary.model_validate(j).id for j in listed] == [job.id]
    assert Job.model_validate(parsed(await unicron_json("status", job.id, api_url=api_url))) == job
    cancelled = parsed(await unicron_json("cancel", job.id, api_url=api_url))
    assert cancelled["state"] == "CANCELLED"
    events = each_line(await unicron_json("events", api_url=api_url))
    assert [(e["seq"], e["event"]["type"]) for e in events] == [
        (1, "job.submitted"), (2, "job.state_changed"),
    ]  # fmt: skip
    assert events[1]["event"]["data"]["new"] == "CANCELLED"

    await state.put_node(NodeRecord(id="node-a", slots=4))
    [node] = parsed(await unicron_json("nodes", api_url=api_url))
    assert NodeRecord.model_validate(node).slots == 4
    no_plan = await unicron_json("plan", api_url=api_url)
    assert no_plan.exit_code == 2 and no_plan.stdout == "" and "no plan" in no_plan.stderr
    plan = Plan(trigger="test", allocations=[
        JobAllocation(job_id=job.id, workers=1, nodes=["node-a"], action=PlanAction.START)
    ])  # fmt: skip
    await state.save_plan(plan)
    assert Plan.model_validate(parsed(await unicron_json("plan", api_url=api_url))).id == plan.id
    record = CalibrationRecord(failure_rate_per_gpu_h=0.5)
    await state.redis.set(CALIBRATION_KEY, record.model_dump_json())
    calibration = parsed(await unicron_json("calibration", api_url=api_url))
    assert CalibrationRecord.model_validate(calibration) == record
    missing = await unicron_json("status", "job-nope", api_url=api_url)
    assert missing.exit_code == 2 and "job 'job-nope' not found" in missing.stderr


async def test_submit_follow_waits_for_the_end_and_prints_the_ended_job(
    api_url: str, state: StateStore, bus: Bus
) -> None:
    follow = asyncio.create_task(unicron_json("submit", "--name", "f", "--follow", api_url=api_url))
    [job] = await eventually(state.list_jobs)
    await move(state, bus, job.id, JobState.STARTING)
    await move(state, bus, job.id, JobState.FAILED)
    result = await follow
    assert result.exit_code == 1, result.output  # a followed job that did not succeed
    assert Job.model_validate_json(result.stdout).state == JobState.FAILED


async def test_logs_and_fault_print_json(
    api_url: str, tmp_path: Path, bus: Bus, state: StateStore
) -> None:
    nodes = await serve_nodes(tmp_path, bus, state)
    await put_job(state, JOB, nodes=("node-a", "node-b"), generation=2)
    nodes["node-b"].write(2, 1, "first", "second", running=False)
    lines = each_line(await unicron_json("logs", JOB, "--rank", "1", api_url=api_url))
    assert [(line["job_id"], line["rank"], line["line"]) for line in lines] == [
        (JOB, 1, "first"), (JOB, 1, "second"),
    ]  # fmt: skip
    fault = ("fault", JOB, "--rank", "0", "--kind", "exit", "--exit-code", "3")
    accepted = FaultAccepted.model_validate(parsed(await unicron_json(*fault, api_url=api_url)))
    assert (accepted.job_id, accepted.rank, accepted.node_id) == (JOB, 0, "node-a")
