"""How the agent's parts are put together: each built whole by the agent, none importing
another's module, and none reaching past the bus's own methods (``unicron.shared.bus.bus.Bus``)."""

from __future__ import annotations

import ast
import io
import re
import tarfile
from pathlib import Path

import pytest
from unicron.services.agent.agent import Agent
from unicron.services.agent.packages import PackageDirs
from unicron.services.agent.settings import AgentSettings
from unicron.shared.bus.bus import Bus
from unicron.shared.bus.packages import PackageError, put_package
from unicron.shared.store.state import StateStore

AGENT_DIR = Path(__file__).resolve().parents[2] / "services" / "agent"
PARTS = {"supervisor", "spares", "channel"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}


@pytest.mark.parametrize("part", sorted(PARTS))
def test_the_parts_know_each_other_by_interface_only(part: str) -> None:
    others = {f"unicron.services.agent.{other}" for other in PARTS - {part}}
    assert imported_modules(AGENT_DIR / f"{part}.py") & others == set()


def test_the_agent_uses_the_bus_by_its_methods() -> None:
    reaching = re.compile(r"\.(nc|js)\b")
    for path in sorted(AGENT_DIR.glob("*.py")):
        assert not reaching.search(path.read_text()), f"{path.name} reaches into the bus"


async def test_the_agent_builds_each_part_whole(
    bus: Bus, state: StateStore, tmp_path: Path
) -> None:
    node = Agent(AgentSettings(node_id="n1", data_dir=tmp_path, spares=1), bus, state)
    assert node.supervisor.launcher.spares is node.spares and node.spares.channel is node.channel
    assert node.supervisor.slots is node.slots is node.spares.slots
    assert node.channel.identify(-1) is None  # asks the supervisor, then the spares


async def test_serve_answers_requests_and_ignores_plain_publishes(bus: Bus) -> None:
    async def upper(request: bytes) -> bytes:
        return request.upper()

    await bus.serve("unicron.agents.n1.test", upper)
    await bus.nc.publish("unicron.agents.n1.test", b"nobody waits")
    reply = await bus.nc.request("unicron.agents.n1.test", b"ping", timeout=5)
    assert reply.data == b"PING"


async def test_connected_follows_the_client(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, source="unicron/test")
    assert bus.connected
    await bus.close()
    assert not bus.connected


def package_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def test_a_package_comes_from_the_bus_s_object_store(bus: Bus, tmp_path: Path) -> None:
    sha, _ = await put_package(bus.js, package_of({"train.py": b"print('hi')\n"}))
    dirs = PackageDirs(bus, tmp_path)
    workdir = await dirs.directory("job-p", sha)
    assert (workdir / "train.py").read_bytes() == b"print('hi')\n"
    with pytest.raises(PackageError, match="not in the store"):
        await dirs.directory("job-q", "0" * 64)
