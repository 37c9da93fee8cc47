"""Redis admits only the stack's users, each to its own keys and to commands that cannot
reconfigure, flush or stop the server; ``unicron up`` keeps the logins private and gives each
child its own; a service that is refused says what to fix and exits (docs/design.md §11)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.exceptions
from unicron.cli.stack import Stack, StackConfig
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.models import Job, JobSpec, NodeRecord
from unicron.shared.contracts.roles import CredentialsError, ServiceUser
from unicron.shared.procs import free_port
from unicron.shared.servers.embedded import EmbeddedServer, redis_server_binary, start_redis
from unicron.shared.store.lease import Lease
from unicron.shared.store.redisauth import check_login, login_url, read_only_keys_supported
from unicron.shared.store.state import StateStore

from tests.secured import AGENT_0, API, CREDENTIALS, PLANNER, USERS, secured, self_signed
from tests.waiting import wait_for

__all__ = ["secured"]  # fixture
Refused = redis.exceptions.NoPermissionError


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[EmbeddedServer]:
    server = start_redis(tmp_path / "redis", logins=CREDENTIALS.redis_logins(USERS))
    yield server
    server.stop()


def url_of(server: EmbeddedServer, user: ServiceUser) -> str:
    return login_url(server.url, user.name, CREDENTIALS.redis[user.name])


@pytest.fixture
async def stores(acl_redis: EmbeddedServer) -> AsyncIterator[dict[ServiceUser, StateStore]]:
    stores = {u: await StateStore.connect(url_of(acl_redis, u), 5) for u in (API, PLANNER, AGENT_0)}
    yield stores
    for store in stores.values():
        await store.close()


async def test_redis_refuses_no_password_and_a_wrong_one_at_once(acl_redis: EmbeddedServer) -> None:
    with pytest.raises(CredentialsError, match="refused the default user"):
        await check_login(acl_redis.url)
    wrong = login_url(acl_redis.url, "api", "guessed")
    with pytest.raises(CredentialsError, match=r"refused user 'api'.*UNICRON_REDIS_URL") as info:
        await check_login(wrong)
    assert "guessed" not in str(info.value)  # the message never repeats a password
    await check_login(url_of(acl_redis, API))


async def test_a_service_keeps_its_state_but_cannot_flush_or_reconfigure(
    stores: dict[ServiceUser, StateStore],
) -> None:
    api = stores[API]
    job, _ = await api.create_job(Job(id="job-1", name="a", spec=JobSpec(name="a")))
    assert [j.id for j in await api.list_jobs()] == [job.id]
    lease = Lease(stores[PLANNER].redis, "planner", ttl_s=5)  # EVAL on unicron: keys
    assert await lease.try_acquire()
    for forbidden in (
        api.redis.flushall(), api.redis.config_set("appendonly", "no"), api.redis.keys("*"),
        api.redis.set("elsewhere", "1"), api.redis.shutdown(),
    ):  # fmt: skip
        with pytest.raises(Refused):
            await forbidden
    assert await api.get_job(job.id) is not None


async def test_transactions_survive_a_kill_9_of_a_redis_with_users(
    acl_redis: EmbeddedServer, tmp_path: Path
) -> None:
    """Redis 7.0 replays its append-only file as the default user (redis/redis#14541): with
    that user stripped of every key, the restart dropped every MULTI/EXEC in the file."""
    api = await StateStore.connect(url_of(acl_redis, API), 5)
    await api.create_job(Job(id="job-1", name="a", spec=JobSpec(name="a")))
    await api.update_job("job-1", _renamed)  # WATCH/MULTI/EXEC
    await api.put_node(NodeRecord(id="node-0", slots=2))
    await api.close()
    # With appendfsync everysec a busy Redis may hold its AOF buffer back for up to 2 s while
    # the previous fsync runs (a kill -9 then loses it, as Redis documents): what is tested is
    # the replay of a transaction the file holds, so the file must hold it first.
    wait_for("the transaction in the append-only file", lambda: _in_aof(tmp_path, b"forged"), 10)
    acl_redis.process.kill()  # no shutdown save: only the append-only file
    acl_redis.process.wait()
    acl_redis.restart()
    api = await StateStore.connect(url_of(acl_redis, API), 5)
    try:
        job, nodes = await api.get_job("job-1"), await api.list_nodes()
    finally:
        await api.close()
    assert job is not None and job.name == "forged"
    assert [n.id for n in nodes] == ["node-0"]
    with pytest.raises(CredentialsError):  # and the default user still cannot log in
        await check_login(acl_redis.url)


async def test_an_agent_reads_jobs_and_writes_only_its_own_node(
    stores: dict[ServiceUser, StateStore],
) -> None:
    await stores[API].create_job(Job(id="job-1", name="a", spec=JobSpec(name="a")))
    agent = stores[AGENT_0]
    assert (job := await agent.get_job("job-1")) is not None and job.name == "a"
    await agent.put_node(NodeRecord(id="node-0", slots=2))
    assert await agent.update_node("node-0", _busy)
    with pytest.raises(Refused):  # another node's record
        await agent.put_node(NodeRecord(id="node-1", slots=2))
    if read_only_keys_supported(redis_server_binary()):  # Redis 7: jobs are read-only to it
        with pytest.raises(Refused):
            await agent.update_job("job-1", _renamed)
        assert (job := await stores[API].get_job("job-1")) is not None and job.name == "a"


def _in_aof(root: Path, data: bytes) -> bool:
    return any(data in f.read_bytes() for f in root.rglob("*.aof"))


def _busy(node: NodeRecord) -> None:
    node.used = 1


def _renamed(job: Job) -> None:
    job.name = "forged"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_unicron_up_keeps_logins_private_and_gives_each_child_its_own(tmp_path: Path) -> None:
    stack = Stack(StackConfig(nodes=2, api_port=free_port(), data_dir=tmp_path / "stack"))
    try:
        stack.start_servers()
        secrets = tmp_path / "stack" / "secrets"
        assert _mode(secrets) == 0o700 and _mode(secrets / "credentials.json") == 0o600
        assert _mode(tmp_path / "stack" / "redis" / "users.acl") == 0o600
        assert all(_mode(conf) == 0o600 for conf in (tmp_path / "stack" / "nats").glob("*.conf"))
        env = stack.login_env(AGENT_0)
        assert env["UNICRON_NATS_USER"] == "agent-node-0"
        assert env["UNICRON_REDIS_URL"].startswith("redis://agent-node-0:")
        others = [stack.login_env(user) for user in USERS if user != AGENT_0]
        assert env["UNICRON_NATS_PASSWORD"] not in {o["UNICRON_NATS_PASSWORD"] for o in others}
        await check_login(env["UNICRON_REDIS_URL"])  # what the child gets logs it in
    finally:
        stack.stop()


async def test_unicron_up_serves_tls_and_hands_its_children_the_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = self_signed(tmp_path)
    monkeypatch.setenv("UNICRON_NATS_TLS_CERT", str(tls.cert))
    monkeypatch.setenv("UNICRON_NATS_TLS_KEY", str(tls.key))
    config = StackConfig(redis_url="redis://x:1/0", data_dir=tmp_path / "stack")
    stack = Stack(config)
    try:
        stack.start_servers()
        assert stack.nats_url.startswith("tls://")
        assert stack.login_env(API)["UNICRON_NATS_TLS_CA"] == str(tls.cert)
        bus = await Bus.connect(stack.nats_url, "unicron/test", 10, stack.operator_access())
        await bus.close()
    finally:
        stack.stop()


def test_a_stack_on_given_servers_passes_no_logins_of_its_own(tmp_path: Path) -> None:
    config = StackConfig(nats_url="nats://x:1", redis_url="redis://x:1/0", data_dir=tmp_path)
    stack = Stack(config)
    stack.start_servers()
    assert stack.login_env(API) == {} and not (tmp_path / "secrets").exists()


def test_a_service_refused_by_nats_names_the_fix_and_exits(
    secured: EmbeddedServer, acl_redis: EmbeddedServer
) -> None:
    login = {"UNICRON_NATS_USER": "detector", "UNICRON_NATS_PASSWORD": "guessed"}
    servers = {"UNICRON_NATS_URL": secured.url, "UNICRON_REDIS_URL": url_of(acl_redis, API)}
    env = {**os.environ, **servers, **login}
    run = subprocess.run(
        [sys.executable, "-m", "unicron.services.detector"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2
    output = run.stdout + run.stderr
    assert "refused user 'detector'" in output and "UNICRON_NATS_PASSWORD" in output
    assert "guessed" not in output and "Traceback" not in output
