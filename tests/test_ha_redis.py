"""Redis with a replica and Sentinels: a failover mid-job loses no job record.

A writer stores and updates job records through the services' StateStore, connected through
the Sentinels, and retries as a service does while Redis is away. Mid-way the primary is
SIGKILLed (or switched over on purpose); every write the store reported as done must be there
afterwards, read through the same store, which never restarted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar, cast

import pytest
import redis
from pydantic import ValidationError
from unicron.shared.addresses import SentinelTarget
from unicron.shared.contracts.jobspec import JobSpec
from unicron.shared.contracts.models import Job
from unicron.shared.contracts.roles import ServiceRole, ServiceUser
from unicron.shared.outage import is_outage
from unicron.shared.servers.embedded import EmbeddedServer
from unicron.shared.servers.redisha import RedisHa, start_redis_ha
from unicron.shared.settings import CommonSettings
from unicron.shared.store.redisauth import login_url
from unicron.shared.store.replicated import ReplicatedRedis
from unicron.shared.store.sentinel import sentinel_client
from unicron.shared.store.state import StateStore

T = TypeVar("T")
WRITES_BEFORE = 40
WRITES_AFTER = 40


# ACL'd as ``unicron up --ha`` runs it: replication and the Sentinels log in as well.
API = ServiceUser(role=ServiceRole.API)
ADMIN = ServiceUser(role=ServiceRole.ADMIN)
PASSWORDS = {API: "api-password", ADMIN: "admin-password"}


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[RedisHa]:
    topology = start_redis_ha(tmp_path / "redis", logins=list(PASSWORDS.items()))
    yield topology
    topology.stop()


@pytest.fixture
async def store(ha: RedisHa) -> AsyncIterator[StateStore]:
    target = SentinelTarget(tuple(("127.0.0.1", s.port) for s in ha.sentinels))
    url = login_url(ha.login_url, API.name, PASSWORDS[API])
    connected = await StateStore.connect(url, connect_timeout_s=10, sentinel=target)
    yield connected
    await connected.close()


async def until_done(write: Callable[[], Awaitable[T]], timeout_s: float = 30.0) -> T:
    """Retry ``write`` while Redis is away, as a service's handler does."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await write()
        except Exception as exc:
            if not is_outage(exc) or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


class Writer:
    """Creates jobs and moves each one step on; remembers what the store said it wrote."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.steps: dict[str, int] = {}  # job id -> the step the store confirmed

    async def write(self, index: int) -> None:
        job = Job(id=f"job-{index}", name="ha", spec=JobSpec(name="ha"))
        await until_done(lambda: self.store.create_job(job, idempotency_key=f"key-{index}"))
        self.steps[job.id] = 0

        def step_on(record: Job) -> None:
            record.step = index

        await until_done(lambda: self.store.update_job(job.id, step_on))
        self.steps[job.id] = index

    async def lost(self) -> list[str]:
        """The jobs whose confirmed write is not what the store reads now."""
        gone = []
        for job_id, step in self.steps.items():
            job = await until_done(lambda: self.store.get_job(job_id))  # noqa: B023
            if job is None or job.step != step:
                gone.append(job_id)
        listed = {job.id for job in await until_done(self.store.list_jobs)}
        return gone + sorted(set(self.steps) - listed)


async def write_through(writer: Writer, fault: Callable[[], int], ha: RedisHa) -> int:
    """Write before and after ``fault`` (which returns the old primary's port), while the
    Sentinels promote; returns the new primary's port."""
    for index in range(WRITES_BEFORE):
        await writer.write(index)
    old_port = fault()
    promoted = asyncio.create_task(asyncio.to_thread(ha.wait_promoted, old_port, 30.0))
    index = WRITES_BEFORE
    while not promoted.done() or index < WRITES_BEFORE + WRITES_AFTER:
        await writer.write(index)
        index += 1
    return await promoted


@pytest.mark.extended  # the switchover below keeps the records too, in less time
async def test_a_killed_primary_loses_no_job_record(ha: RedisHa, store: StateStore) -> None:
    writer = Writer(store)

    def kill_primary() -> int:
        primary = ha.primary()
        assert primary is not None
        primary.process.kill()  # SIGKILL: no shutdown, no last fsync
        return primary.port

    old = ha.primary()
    started = time.monotonic()
    new_port = await write_through(writer, kill_primary, ha)
    assert await writer.lost() == []
    assert len(writer.steps) >= WRITES_BEFORE + WRITES_AFTER
    assert time.monotonic() - started < 45

    # Started again, the old primary follows the new one, and writes are confirmed again.
    assert old is not None and new_port != old.port
    await asyncio.to_thread(old.restart)
    await asyncio.to_thread(synced, old)
    confirmations = cast(ReplicatedRedis, store.redis).confirmations
    unconfirmed = confirmations.unconfirmed
    for index in range(1000, 1010):
        await writer.write(index)
    assert confirmations.unconfirmed == unconfirmed
    assert await writer.lost() == []


def synced(replica: EmbeddedServer, timeout_s: float = 15.0) -> None:
    """Wait until ``replica`` has synced with its primary."""
    client = redis.Redis(port=replica.port, username=ADMIN.name, password=PASSWORDS[ADMIN])
    deadline = time.monotonic() + timeout_s
    try:
        while client.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, f"{replica.name} did not sync"
            time.sleep(0.1)
    finally:
        client.close()


async def test_a_switchover_loses_no_job_record(ha: RedisHa, store: StateStore) -> None:
    # The old primary lives on as a replica and answers READONLY: the store must move on.
    writer = Writer(store)

    def switch_over() -> int:
        port = ha.master_port()
        assert port is not None
        ha.failover()
        return port

    await write_through(writer, switch_over, ha)
    assert await writer.lost() == []


@pytest.mark.extended
async def test_a_lost_replica_slows_no_write_for_long(ha: RedisHa, store: StateStore) -> None:
    replica = next(s for s in ha.data if s.port != ha.master_port())
    replica.process.kill()
    replica.process.wait()
    writer = Writer(store)
    started = time.monotonic()
    for index in range(20):
        await writer.write(index)
    # 20 jobs, 3 writes each: the first waits out the replica's full timeout, the rest briefly.
    assert time.monotonic() - started < 20.0  # not 60 one-second waits
    assert await writer.lost() == []


@pytest.mark.parametrize("sentinels", ["127.0.0.1", "host:port", "a:1,,b:2", "a:70000"])
def test_a_bad_sentinel_list_is_a_settings_error_naming_the_entry(
    sentinels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNICRON_REDIS_SENTINELS", sentinels)
    with pytest.raises(ValidationError, match="UNICRON_REDIS_SENTINELS entry"):
        CommonSettings()


def test_sentinels_in_the_settings_are_where_the_store_connects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("UNICRON_REDIS_SENTINELS", "10.0.0.1:26379, 10.0.0.2:26379")
    monkeypatch.setenv("UNICRON_REDIS_MASTER", "prod")
    target = CommonSettings().redis_sentinel
    assert target == SentinelTarget((("10.0.0.1", 26379), ("10.0.0.2", 26379)), "prod")


def test_a_sentinel_password_reaches_the_sentinels_and_no_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("UNICRON_REDIS_SENTINELS", "10.0.0.1:26379")
    monkeypatch.setenv("UNICRON_REDIS_SENTINEL_PASSWORD", "s3ntinel-secret")
    target = CommonSettings().redis_sentinel
    assert target is not None and target.password == "s3ntinel-secret"
    assert "s3ntinel-secret" not in repr(target) + repr(CommonSettings())
    client = sentinel_client("redis://unicron:pw@ignored:6379/0", target)
    sentinel_pool = client.connection_pool.sentinel_manager.sentinels[0].connection_pool
    assert sentinel_pool.connection_kwargs["password"] == "s3ntinel-secret"
