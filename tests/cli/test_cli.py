"""The client commands against a real API: what a user types, sees, and gets as exit code."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result
from unicron.cli.main import app
from unicron.cli.render import event_line
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import NodeJoined
from unicron.shared.contracts.models import Job, JobState, NodeRecord
from unicron.shared.procs import free_port
from unicron.shared.store.state import StateStore

from tests.api.factories import moved
from tests.api.live import eventually
from unicron.client import Client

runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


async def unicron(*args: str, api_url: str | None = None) -> Result:
    """Run one command in a thread, so the test's event loop stays free for its fixtures."""
    argv = [*args, "--api", api_url] if api_url else list(args)
    async with asyncio.timeout(30):
        return await asyncio.to_thread(lambda: runner.invoke(app, argv))


async def test_submit_status_cancel_and_events(api_url: str, state: StateStore) -> None:
    submitted = await unicron("submit", "--name", "tiny", "--steps", "10", api_url=api_url)
    assert submitted.exit_code == 0, submitted.output
    [job] = await state.list_jobs()
    assert job.spec.steps == 10 and job.state == JobState.PENDING
    assert job.id in submitted.stdout and "PENDING" in submitted.stdout

    table = await unicron("status", api_url=api_url)
    assert table.exit_code == 0
    assert job.id in table.stdout and "tiny" in table.stdout and "0/10" in table.stdout

    cancelled = await unicron("cancel", job.id, api_url=api_url)
    assert cancelled.exit_code == 0 and "CANCELLED" in cancelled.stdout
    detail = await unicron("status", job.id, api_url=api_url)
    assert detail.exit_code == 0
    assert "submitted" in detail.stdout and "cancelled by user" in detail.stdout

    history = await unicron("events", api_url=api_url)
    assert history.exit_code == 0
    lines = history.stdout.splitlines()
    assert "job.submitted" in lines[0] and job.id in lines[0] and "steps=10" in lines[0]
    assert "job.state_changed" in lines[1] and "PENDING → CANCELLED" in lines[1]
    later = await unicron("events", "--since", "1", api_url=api_url)
    assert later.stdout.splitlines() == lines[1:]

    again = await unicron("cancel", job.id, api_url=api_url)
    assert again.exit_code == 0


async def test_submit_from_yaml_with_an_option_overriding_it(
    api_url: str, state: StateStore, tmp_path: Path
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: from-file\nsteps: 50\nmax_workers: 2\nmodel:\n  n_layer: 2\n")
    result = await unicron(
        "submit", str(spec), "--steps", "7", "--idempotency-key", "k1", api_url=api_url
    )
    assert result.exit_code == 0, result.output
    replay = await unicron(
        "submit", str(spec), "--steps", "7", "--idempotency-key", "k1", api_url=api_url
    )
    assert replay.exit_code == 0 and "already submitted" in replay.stdout
    changed = await unicron("submit", str(spec), "--idempotency-key", "k1", api_url=api_url)
    assert changed.exit_code == 2 and "different spec" in changed.stderr
    [job] = await state.list_jobs()
    assert (job.name, job.spec.steps, job.spec.max_workers, job.spec.model.n_layer) == (
        "from-file", 7, 2, 2,
    )  # fmt: skip


async def test_bad_input_exits_2_with_the_reason(
    api_url: str, state: StateStore, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    listed = tmp_path / "list.yaml"
    listed.write_text("- name: a\n")
    inconsistent = tmp_path / "minmax.yaml"
    inconsistent.write_text("name: a\nmin_workers: 4\nmax_workers: 2\n")

    cases = [
        (["submit", str(broken)], "cannot read job spec"),
        (["submit", str(listed)], "must be a YAML mapping"),
        (["submit", str(inconsistent)], "min_workers must not exceed max_workers"),
        (["submit", "--name", "a", "--steps", "0"], "steps: Input should be greater than 0"),
        (["submit", "--steps", "5"], "give a job spec FILE or --name"),
        (["status", "job-000000000000"], "job 'job-000000000000' not found"),
        (["cancel", "job-000000000000"], "not found"),
    ]
    for args, message in cases:
        result = await unicron(*args, api_url=api_url)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr, (args, result.stderr)
    assert await state.list_jobs() == []

    assert (await unicron("submit", "--name", "done", api_url=api_url)).exit_code == 0
    [job] = await state.list_jobs()
    await state.update_job(job.id, moved(JobState.STARTING, JobState.SUCCEEDED))
    conflict = await unicron("cancel", job.id, api_url=api_url)
    assert conflict.exit_code == 2 and "already ended as SUCCEEDED" in conflict.stderr


async def test_status_lists_every_page_or_a_limit_and_filters_by_state(
    api_url: str, state: StateStore
) -> None:
    with Client(api_url) as client:
        submitted = [client.submit({"name": f"j{i}"}).id for i in range(5)]
        client.cancel(submitted[1])
        pages = [[job.id for job in page] for page in client.pages(page_limit=2)]
        assert pages == [submitted[:2], submitted[2:4], submitted[4:]]
        assert [job.id for job in client.list()] == submitted
        assert [job.id for job in client.list(limit=3)] == submitted[:3]

    def rows(output: str) -> list[str]:
        return [line.split()[0] for line in output.splitlines() if line.strip().startswith("job-")]

    everything = await unicron("status", api_url=api_url)
    assert everything.exit_code == 0 and rows(everything.stdout) == submitted
    limited = await unicron("status", "--limit", "2", api_url=api_url)
    assert limited.exit_code == 0 and rows(limited.stdout) == submitted[:2]
    assert "only the first 2 jobs are shown" in limited.stdout
    cancelled = await unicron("status", "--state", "cancelled", api_url=api_url)
    assert rows(cancelled.stdout) == [submitted[1]]
    both = await unicron("status", "--state", "CANCELLED", "--state", "PENDING", api_url=api_url)
    assert rows(both.stdout) == submitted and "only the first" not in both.stdout
    refused = await unicron("status", "--limit", "0", api_url=api_url)
    assert refused.exit_code == 2 and "--limit" in refused.output


async def test_unreachable_api_exits_3() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (["status"], ["submit", "--name", "a"], ["nodes"], ["events"]):
        result = await unicron(*args, api_url=url)
        assert result.exit_code == 3, (args, result.output)
        assert f"cannot reach the Unicron API at {url}" in result.stderr


async def test_nodes_table(
    api_url: str, state: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = await unicron("nodes", api_url=api_url)
    assert empty.exit_code == 0 and "no nodes registered" in empty.stdout
    await state.put_node(NodeRecord(id="node-a", slots=4, used=2))
    result = await unicron("nodes", api_url=api_url)
    assert result.exit_code == 0
    [row] = [line for line in result.stdout.splitlines() if "node-a" in line]
    assert row.split()[:4] == ["node-a", "READY", "4", "2"]
    why = "Xid 79: the GPU has fallen off the bus"
    await state.put_node(NodeRecord(id="node-a", slots=3, gpus=4, retired_gpus={"2": why}))
    result = await unicron("--output", "json", "nodes", api_url=api_url)
    assert json.loads(result.stdout)[0]["retired_gpus"] == {"2": why}
    monkeypatch.setenv("COLUMNS", "200")  # the fault on one line
    shown = await unicron("nodes", api_url=api_url)
    assert f"3 (GPU 2 retired: {why})" in shown.stdout


async def test_submit_follow_shows_progress_until_the_job_ends(
    api_url: str, state: StateStore
) -> None:
    follow = asyncio.create_task(
        unicron("submit", "--name", "f", "--steps", "20", "--follow", "--interval", "0.05",
                api_url=api_url)
    )  # fmt: skip
    [job] = await eventually(state.list_jobs)
    job_id = job.id

    def running(job: Job) -> None:
        moved(JobState.STARTING, JobState.RUNNING, reason="first step done")(job)
        job.step = 5

    await state.update_job(job_id, running)
    assert not follow.done()
    await state.update_job(job_id, moved(JobState.SUCCEEDED, reason="all steps done"))
    result = await follow
    assert result.exit_code == 0, result.output
    assert "first step done" in result.stdout and "all steps done" in result.stdout
    assert f"{job_id} ended SUCCEEDED" in result.stdout


async def test_client_follows_the_event_stream_live(api_url: str, bus: Bus) -> None:
    await bus.publish_event(NodeJoined(node_id="node-y", slots=8, host="h", boot_id="b"))
    with Client(api_url) as client:
        stream = client.sequenced_events(since=0, follow=True)
        seq, first = await asyncio.wait_for(asyncio.to_thread(next, stream), 10)
        assert (seq, first.type, first.subject) == (1, "node.joined", "node-y")
        await bus.publish_event(NodeJoined(node_id="node-z", slots=8, host="h", boot_id="b"))
        seq, live = await asyncio.wait_for(asyncio.to_thread(next, stream), 10)
        assert (seq, live.subject) == (2, "node-z")
        assert "slots=8" in str(event_line(seq, live))
        stream.close()
