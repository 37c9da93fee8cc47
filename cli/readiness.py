"""When a stack started by ``unicron up`` (``cli/stack.py``) is ready: its API answers
``/readyz`` and every agent's node is registered. The nodes are asked with a configured token,
an admin's where there is one, when the API requires tokens."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx


def wait_until_ready(
    api_url: str, nodes: int, env: dict[str, str], check_alive: Callable[[], None],
    timeout_s: float, logs: Path,
) -> None:  # fmt: skip
    """Return once ready; ``check_alive`` raises for a child that died meanwhile."""
    token = api_token(env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        check_alive()
        try:
            ready = httpx.get(f"{api_url}/readyz", timeout=1.0).status_code == 200
            if ready and len(registered_nodes(api_url, token)) >= nodes:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"stack not ready in {timeout_s}s; logs in {logs}")


def registered_nodes(api_url: str, token: str | None) -> list[object]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{api_url}/v1/nodes", headers=headers, timeout=1.0)
    if response.status_code in (401, 403):
        raise RuntimeError(f"the API refused the readiness check: {response.text}")
    nodes: list[object] = response.json()
    return nodes


def api_token(env: dict[str, str]) -> str | None:
    """A token of ``UNICRON_API_TOKENS``, an admin's first; None without tokens."""
    try:
        tokens = json.loads(env.get("UNICRON_API_TOKENS") or "{}")
    except ValueError:  # the API refuses them too and exits, which check_alive reports
        return None
    by_role = sorted(tokens, key=lambda t: str(tokens[t].get("role")) != "admin")
    return by_role[0] if by_role else None
