"""``unicron up``'s start: ready with tokens configured; a child that dies is named with its log."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from unicron.cli.readiness import api_token
from unicron.cli.stack import Stack, StackConfig
from unicron.shared.procs import free_port

from tests.api.factories import ADMIN, TOKENS, USER_A, bearer


def test_a_stack_with_tokens_starts_and_is_ready(
    nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    user_first = {USER_A: TOKENS[USER_A], ADMIN: TOKENS[ADMIN]}
    config = StackConfig(
        nodes=1, slots=1, nats_url=nats_url, redis_url=redis_url, api_port=free_port(),
        data_dir=tmp_path / "stack", extra_env={"UNICRON_API_TOKENS": json.dumps(user_first)},
    )  # fmt: skip
    with Stack(config) as stack:  # start() returns only once the node is registered
        nodes = httpx.get(f"{stack.api_url}/v1/nodes", headers=bearer(ADMIN), timeout=5)
        assert [n["id"] for n in nodes.json()] == ["node-0"]
        assert httpx.get(f"{stack.api_url}/v1/nodes", timeout=5).status_code == 401
        assert api_token(stack.env()) == ADMIN  # the admin, though a user token is listed first


def test_a_child_that_dies_during_the_start_is_named_with_its_log(
    nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    """What CI and a terminal show is the cause, not only a path to a log on another machine."""
    config = StackConfig(
        nodes=1, slots=1, nats_url=nats_url, redis_url=redis_url, api_port=free_port(),
        data_dir=tmp_path / "stack", node_env={"node-0": {"UNICRON_SLOTS": "many"}},
    )  # fmt: skip
    with pytest.raises(RuntimeError) as failed:
        Stack(config).__enter__()
    said = str(failed.value)
    assert said.startswith("agent-node-0 exited with 2")
    assert "agent: invalid UNICRON_SLOTS" in said
