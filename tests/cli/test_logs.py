"""``unicron logs`` prints a rank's output from its node's agent, follows it, and exits 2 or 3
with the reason when it cannot."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner, Result
from unicron.cli.main import app
from unicron.shared.bus.bus import Bus
from unicron.shared.procs import free_port
from unicron.shared.store.state import StateStore

from tests.api.factories import put_job
from tests.api.log_nodes import JOB, Node, serve_nodes

runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "UNICRON_API_TOKEN": None})


async def unicron(*argv: str) -> Result:
    """Run one command in a thread, so the test's event loop serves the agents meanwhile."""
    async with asyncio.timeout(30):
        return await asyncio.to_thread(lambda: runner.invoke(app, list(argv)))


async def running_job(tmp_path: Path, bus: Bus, state: StateStore) -> Node:
    nodes = await serve_nodes(tmp_path, bus, state)
    await put_job(state, JOB, nodes=("node-a", "node-b"), generation=2)
    nodes["node-b"].write(2, 1, *(f"rank 1 line {i}" for i in range(5)))
    return nodes["node-b"]


async def test_logs_prints_and_follows_a_rank(
    api_url: str, tmp_path: Path, bus: Bus, state: StateStore
) -> None:
    node = await running_job(tmp_path, bus, state)
    shown = await unicron("logs", JOB, "--rank", "1", "--tail", "2", "--api", api_url)
    assert shown.exit_code == 0, shown.output
    assert shown.stdout == "rank 1 line 3\nrank 1 line 4\n"

    followed = asyncio.create_task(unicron("logs", JOB, "--rank", "1", "-f", "--api", api_url))
    await asyncio.wait_for(node.followed.wait(), 20)
    node.write(2, 1, "written while followed", running=False)
    result = await followed
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("rank 1 line 4\nwritten while followed\n")


async def test_logs_exits_with_the_reason_when_it_cannot(
    api_url: str, tmp_path: Path, bus: Bus, state: StateStore
) -> None:
    await running_job(tmp_path, bus, state)
    cases = [
        (("logs", "job-nope", "--api", api_url), 2, "job 'job-nope' not found"),
        (("logs", JOB, "--rank", "7", "--api", api_url), 2, "rank 7 of generation 2 never ran"),
        (("logs", JOB, "--tail", "-1", "--api", api_url), 2, "Invalid value for '--tail'"),
        (("logs", JOB, "--api", f"http://127.0.0.1:{free_port()}"), 3, "cannot reach"),
    ]
    for argv, code, words in cases:
        result = await unicron(*argv)
        assert result.exit_code == code, (argv, result.output)
        assert words in result.stderr, (argv, result.stderr)
