"""``unicron fault`` and the global ``--token`` against a real API that has tokens configured."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner, Result
from unicron.cli.main import app
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.messages import command_subject
from unicron.shared.store.state import StateStore

from tests.api.factories import ADMIN, TOKENS, USER_A, commands_sent, put_job
from tests.api.live import serve_api

runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "UNICRON_API_TOKEN": None})


@pytest.fixture
def secured_url(nats_url: str, redis_url: str) -> Iterator[str]:
    with serve_api(nats_url, redis_url, api_tokens=TOKENS) as url:
        yield url


async def unicron(*argv: str, env: dict[str, str] | None = None) -> Result:
    """Run one command in a thread, so the test's event loop stays free for its fixtures."""
    async with asyncio.timeout(30):
        return await asyncio.to_thread(lambda: runner.invoke(app, list(argv), env=env))


async def test_fault_command_injects_and_reports_where(
    secured_url: str, state: StateStore, bus: Bus
) -> None:
    await put_job(state, "job-drill", nodes=("node-a", "node-b"), generation=2)
    args = ("fault", "job-drill", "--rank", "1", "--kind", "exception", "--message", "boom")
    result = await unicron("--token", ADMIN, *args, "--at-step", "9", "--api", secured_url)
    assert result.exit_code == 0, result.output
    assert "injected exception into rank 1 of job-drill (generation 2, node node-b) at step 9" in (
        result.stdout
    )
    raw = await bus.js.get_last_msg("UNICRON_COMMANDS", command_subject("node-b"))
    sent = json.loads(raw.data or b"")
    assert f"fault id {sent['command_id']}" in result.stdout
    assert (sent["fault"]["kind"], sent["fault"]["message"], sent["fault"]["at_step"]) == (
        "exception", "boom", 9,
    )  # fmt: skip

    # The token also comes from the environment, for every client command.
    listed = await unicron("status", "--api", secured_url, env={"UNICRON_API_TOKEN": ADMIN})
    assert listed.exit_code == 0 and "job-drill" in listed.stdout


async def test_refused_faults_exit_2_with_the_servers_reason(
    secured_url: str, state: StateStore, bus: Bus
) -> None:
    await put_job(state, "job-drill")
    fault = ("fault", "job-drill", "--api", secured_url)
    cases = [
        ((*fault, "--rank", "0", "--kind", "crash"), None, "needs a bearer token"),
        ((*fault, "--rank", "0", "--kind", "crash"), USER_A, "needs an admin token"),
        ((*fault, "--rank", "5", "--kind", "crash"), ADMIN, "rank: rank 5 is not a worker"),
        ((*fault, "--rank", "0", "--kind", "crash", "--message", "x"), ADMIN,
         "message applies to kind 'exception' only"),
        ((*fault, "--rank", "0", "--kind", "slow", "--slowdown", "0.5"), ADMIN,
         "slowdown: Input should be greater than 1"),
        (("fault", "job-nope", "--api", secured_url, "--rank", "0", "--kind", "hang"), ADMIN,
         "job 'job-nope' not found"),
        ((*fault, "--rank", "0", "--kind", "explode"), ADMIN, "Invalid value for '--kind'"),
    ]  # fmt: skip
    for args, token, message in cases:
        result = await unicron(*args, env={"UNICRON_API_TOKEN": token} if token else None)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr, (args, result.stderr)
    spaced = await unicron("--token", "two words", "status", "--api", secured_url)
    assert spaced.exit_code == 2 and "printable ASCII without spaces" in spaced.stderr
    assert await commands_sent(bus) == 0
