"""``unicron up`` with API tokens configured: the stack starts and reports ready."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
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
        assert stack._token() == ADMIN  # the admin token, though a user token is listed first
