"""The address a node advertises for its rendezvous store (issue 13): found from the route to
NATS when unset, kept when set, refused at start-up when peers could not reach it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from unicron.services.agent.address import (
    AddressError,
    advertised_host,
    check_reachable,
    route_address,
)
from unicron.services.agent.agent import Agent, run
from unicron.services.agent.settings import AgentSettings
from unicron.shared.bus.bus import Bus
from unicron.shared.procs import free_port
from unicron.shared.store.state import StateStore

from tests.agent.process import REPO, agent_env

MADE_UP_NATS = "nats://10.255.255.1:4222"  # no server there: a connection attempt would hang


def _outbound_address() -> str | None:
    """This machine's address on its default route (what ``ip route get 1.1.1.1`` says)."""
    try:
        found = route_address("10.255.255.1", 4222)
    except AddressError:
        return None
    return None if found.startswith("127.") else found


def test_nats_on_loopback_gives_loopback() -> None:
    assert advertised_host(None, "nats://127.0.0.1:4222") == "127.0.0.1"
    assert advertised_host(None, "nats://localhost:4222") == "127.0.0.1"  # IPv4 first
    assert advertised_host(None, "127.0.0.1") == "127.0.0.1"  # a bare host:port is a URL too


def test_nats_elsewhere_gives_the_interface_that_routes_there() -> None:
    outbound = _outbound_address()
    if outbound is None:
        pytest.skip("this machine has no route off loopback")
    assert advertised_host(None, MADE_UP_NATS) == outbound
    assert advertised_host(None, f"{MADE_UP_NATS},nats://127.0.0.1:4222") == outbound  # first


def test_an_explicit_address_is_kept() -> None:
    assert advertised_host("10.0.0.5", MADE_UP_NATS) == "10.0.0.5"
    assert advertised_host("10.0.0.5", "nats://127.0.0.1:4222") == "10.0.0.5"
    assert advertised_host("127.0.0.1", "nats://localhost:4222") == "127.0.0.1"  # one host


def test_loopback_with_nats_elsewhere_is_refused_without_leaking_the_login() -> None:
    with pytest.raises(AddressError, match="UNICRON_HOST=localhost is a loopback") as err:
        advertised_host("localhost", "tls://agent:s3cret@10.255.255.1:4443")
    assert "tls://10.255.255.1:4443" in str(err.value) and "s3cret" not in str(err.value)


def test_a_nats_name_that_does_not_resolve_cannot_be_routed_to() -> None:
    with pytest.raises(AddressError, match="set UNICRON_HOST"):
        advertised_host(None, "nats://nats.invalid:4222")


def test_the_agent_refuses_loopback_before_connecting(tmp_path: Path) -> None:
    """Exit 2 with the reason, fast: NATS at a made-up address is never dialled (a connection
    attempt there would take its whole 30-s timeout)."""
    env = agent_env(MADE_UP_NATS, "redis://127.0.0.1:1/0", tmp_path / "data")
    env["UNICRON_HOST"] = "127.0.0.1"
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "unicron.services.agent"],
        cwd=REPO, env=env, capture_output=True, timeout=20,
    )  # fmt: skip
    elapsed = time.monotonic() - began
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert "UNICRON_HOST=127.0.0.1 is a loopback address" in stderr
    assert MADE_UP_NATS in stderr
    assert elapsed < 15, f"took {elapsed:.1f} s"


async def test_a_port_nobody_listens_on_is_unreachable() -> None:
    port = free_port()
    with pytest.raises(AddressError, match=rf"advertises 127\.0\.0\.1:{port}.*Fix UNICRON_HOST"):
        await check_reachable("127.0.0.1", port, "UNICRON_HOST")


async def test_the_agent_will_not_advertise_a_store_it_cannot_reach(
    bus: Bus, state: StateStore, tmp_path: Path
) -> None:
    """Bound to one address, advertised at another: the start fails with exit code 2 and a
    reason naming the advertised address, instead of every rendezvous hanging later."""
    settings = AgentSettings(
        node_id="n1", data_dir=tmp_path, spares=0, host="127.0.0.1", store_bind_host="127.0.0.2"
    )
    node = Agent(settings, bus, state)
    with pytest.raises(
        AddressError, match=r"advertises 127\.0\.0\.1:\d+ .*UNICRON_STORE_BIND_HOST"
    ):
        await asyncio.wait_for(node.run(asyncio.Event()), timeout=60)
    with pytest.raises(SystemExit) as exited:
        await run(bus, state, asyncio.Event(), settings)  # no task: SystemExit stays here
    assert exited.value.code == 2


async def test_the_agent_says_which_address_it_cannot_listen_on(
    bus: Bus, state: StateStore, tmp_path: Path
) -> None:
    settings = AgentSettings(node_id="n1", data_dir=tmp_path, spares=0, host="198.51.100.77")
    with pytest.raises(AddressError, match=r"cannot listen on 198\.51\.100\.77.*UNICRON_HOST"):
        await asyncio.wait_for(Agent(settings, bus, state).run(asyncio.Event()), timeout=60)
