"""``unicron up --ha``: the stack on a NATS cluster and a Redis watched by Sentinels."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import httpx
from unicron.cli.stack import Stack, StackConfig
from unicron.shared.bus.bus import Bus
from unicron.shared.bus.streams import STREAMS
from unicron.shared.contracts.roles import ServiceRole, ServiceUser
from unicron.shared.procs import free_port

from tests.waiting import wait_for


async def stream_replicas(stack: Stack) -> set[int | None]:
    """The streams' replica counts, as a role that only reads them sees them."""
    assert stack.logins is not None
    detector = ServiceUser(role=ServiceRole.DETECTOR)
    access = stack.logins.credentials.nats_access(detector, stack.logins.nats_tls_ca)
    bus = await Bus.connect(stack.nats_url, "unicron/test", 10, access)
    try:
        return {(await bus.js.stream_info(name)).config.num_replicas for name in STREAMS}
    finally:
        await bus.close()


def test_unicron_up_ha_comes_up_on_the_ha_servers_and_is_ready(tmp_path: Path) -> None:
    config = StackConfig(
        nodes=1, slots=1, api_port=free_port(), data_dir=tmp_path / "stack", ha=True
    )
    with Stack(config) as stack:  # start() returns only once the API is ready and the node in
        ready = httpx.get(f"{stack.api_url}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text
        assert len(stack.nats_url.split(",")) == 3
        assert stack.redis_ha is not None
        api_env = stack.children["api"].env
        assert api_env["UNICRON_REDIS_SENTINELS"] == stack.redis_ha.sentinels_setting
        assert api_env["UNICRON_STREAM_REPLICAS"] == "3"
        assert asyncio.run(stream_replicas(stack)) == {3}  # as the API created them
        for role in ("planner", "executor"):  # one active, one warm standby on the lease
            logs = [stack.data_dir / "logs" / f"{name}.log" for name in stack.instances(role)]
            probe = functools.partial(_active_and_standby, logs, role)
            wait_for(f"an active {role} and a standby", probe)


def _active_and_standby(logs: list[Path], role: str) -> bool:
    said = [log.read_text() if log.exists() else "" for log in logs]
    active = [f"{role} active" in text for text in said]
    return sorted(active) == [False, True] and "standing by" in said[active.index(False)]
