"""``UNICRON_STORE_PORTS`` pins the node's stores to a range a firewall can open (issue 13):
each store takes the first free port, and a range used up is a clear error, never a hang."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError
from unicron.services.agent.agent import Agent, run
from unicron.services.agent.master import MasterStores, MasterUnavailableError
from unicron.services.agent.settings import AgentSettings
from unicron.services.agent.store import RendezvousStore, StorePortsExhaustedError
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.messages import Rendezvous
from unicron.shared.procs import free_port
from unicron.shared.store.state import StateStore

from tests.agent.process import REPO, agent_env


def _free_pair() -> range:
    """Two consecutive ports nobody listens on now."""
    for _ in range(50):
        low = free_port()
        with contextlib.suppress(OSError), socket.socket() as probe:
            probe.bind(("127.0.0.1", low + 1))
            return range(low, low + 2)
    raise RuntimeError("no two free consecutive ports")


@pytest.fixture
def pair() -> range:
    return _free_pair()


@contextlib.contextmanager
def occupied(ports: range) -> Iterator[None]:
    """Another program listens on every port of ``ports``."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield


def test_the_range_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNICRON_STORE_PORTS", "29500-29599")
    assert AgentSettings().store_port_choice == range(29500, 29600)
    monkeypatch.delenv("UNICRON_STORE_PORTS")
    monkeypatch.setenv("UNICRON_STORE_PORT", "29400")
    assert AgentSettings().store_port_choice == 29400  # one port still works


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("29500", "is not a range LO-HI"),
        ("29500-", "is not a range LO-HI"),
        ("29599-29500", "LO <= HI"),
        ("0-100", "1 <= LO"),
        ("65000-70000", "HI <= 65535"),
    ],
)
def test_a_bad_range_is_a_clear_settings_error(
    monkeypatch: pytest.MonkeyPatch, value: str, says: str
) -> None:
    monkeypatch.setenv("UNICRON_STORE_PORTS", value)
    with pytest.raises(ValidationError, match=f"UNICRON_STORE_PORTS='{value}'.*{says}"):
        AgentSettings()


def test_a_port_and_a_range_are_one_too_many(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNICRON_STORE_PORTS", "29500-29599")
    monkeypatch.setenv("UNICRON_STORE_PORT", "29500")
    with pytest.raises(ValidationError, match="UNICRON_STORE_PORT and UNICRON_STORE_PORTS"):
        AgentSettings()


def test_the_agent_exits_2_on_a_bad_range(tmp_path: Path) -> None:
    env = agent_env("nats://127.0.0.1:1", "redis://127.0.0.1:1/0", tmp_path / "data")
    env["UNICRON_STORE_PORTS"] = "29599-29500"
    done = subprocess.run(
        [sys.executable, "-m", "unicron.services.agent"],
        cwd=REPO, env=env, capture_output=True, timeout=20,
    )  # fmt: skip
    assert done.returncode == 2
    assert "agent: invalid UNICRON_STORE_PORTS" in done.stderr.decode()


async def test_stores_take_the_free_ports_of_the_range_until_none_is_left(pair: range) -> None:
    first, second = RendezvousStore("127.0.0.1", pair), RendezvousStore("127.0.0.1", pair)
    try:
        assert {await first.start(), await second.start()} == set(pair)
        with pytest.raises(StorePortsExhaustedError, match=f"{pair[0]}-{pair[1]}.*all 2"):
            await RendezvousStore("127.0.0.1", pair).start()
    finally:
        first.close()
        second.close()


async def test_ports_other_programs_hold_are_skipped(pair: range) -> None:
    with occupied(range(pair[0], pair[0] + 1)):
        store = RendezvousStore("127.0.0.1", pair)
        assert await store.start() == pair[1]
        store.close()


async def test_a_master_store_takes_a_port_of_the_range_or_refuses_the_start(pair: range) -> None:
    """Two agents of a job: the one that hosts the generation's master store finds the range
    used up, and both refuse their rank's start at once with the reason."""
    store = RendezvousStore("127.0.0.1", range(pair[0], pair[0] + 1))
    await store.start()
    masters = MasterStores("127.0.0.1", "127.0.0.1", range(pair[1], pair[1] + 1), timeout_s=30)
    other = MasterStores("127.0.0.1", "127.0.0.1", range(pair[1], pair[1] + 1), timeout_s=30)
    try:

        def rendezvous(job: str) -> Rendezvous:
            return Rendezvous(host="127.0.0.1", port=pair[0], prefix=f"{job}/g1/")

        assert await masters.address("job-a", 1, rendezvous("job-a")) == ("127.0.0.1", pair[1])
        began = time.monotonic()
        with pytest.raises(MasterUnavailableError, match=f"job-b generation 1.*{pair[1]}"):
            await masters.address("job-b", 1, rendezvous("job-b"))
        with pytest.raises(MasterUnavailableError, match="no free port left"):
            await other.address("job-b", 1, rendezvous("job-b"))
        assert time.monotonic() - began < 10  # not the 30-s wait for an address
    finally:
        masters.close_all()
        other.close_all()
        store.close()


async def test_the_agent_exits_2_when_the_range_is_used_up(
    bus: Bus, state: StateStore, tmp_path: Path, pair: range
) -> None:
    ports = f"{pair[0]}-{pair[0]}"
    settings = AgentSettings(node_id="n1", data_dir=tmp_path, spares=0, store_ports=ports)
    with occupied(range(pair[0], pair[0] + 1)):
        with pytest.raises(StorePortsExhaustedError, match=f"UNICRON_STORE_PORTS={ports}"):
            await asyncio.wait_for(Agent(settings, bus, state).run(asyncio.Event()), 60)
        with pytest.raises(SystemExit) as exited:
            await run(bus, state, asyncio.Event(), settings)  # no task: SystemExit stays here
    assert exited.value.code == 2
