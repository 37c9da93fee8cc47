"""The agent as a process (``python -m unicron.services.agent``) for the agent's tests, against
the real servers of tests/conftest.py: the node it runs as, its environment, an inbox to await
what it publishes, and its node's record in Redis. The fixtures that start it (``agent``,
``joined``, ``heard``) are in conftest.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.models import NodeRecord
from unicron.shared.contracts.reports import StepsCompleted
from unicron.shared.store.state import StateStore

T = TypeVar("T")
NODE = "n1"
REPO = Path(__file__).resolve().parents[2]
FAKE_WORKER = "tests.agent.fake_worker"


class Inbox:
    """Everything one durable consumer sees, for waiting on one kind of message at a time."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.seen: list[object] = []
        self.unclaimed: list[object] = []  # arrived while another kind was awaited

    async def put(self, item: object) -> None:
        # a node's batch of steps, as the ranks' own steps: tests wait for those
        for each in item.steps if isinstance(item, StepsCompleted) else [item]:
            self.seen.append(each)
            await self.queue.put(each)

    async def next(self, match: Callable[[object], bool], within: float = 10.0) -> object:
        """The oldest matching message not yet returned. Messages from different sources (a
        worker's reports, the agent's own) may arrive in either order, so none is discarded."""
        for index, item in enumerate(self.unclaimed):
            if match(item):
                return self.unclaimed.pop(index)
        async with asyncio.timeout(within):
            while not match(item := await self.queue.get()):
                self.unclaimed.append(item)
            return item

    async def report(self, cls: type[T], within: float = 10.0, **fields: object) -> T:
        def match(item: object) -> bool:
            return isinstance(item, cls) and all(getattr(item, k) == v for k, v in fields.items())

        found = await self.next(match, within)
        assert isinstance(found, cls)
        return found


async def inbox(bus: Bus, subject: str, parse: Callable[[bytes], object]) -> Inbox:
    box = Inbox()
    durable = "test-" + subject.replace(".", "-").replace(">", "all").replace("*", "any")
    await bus.consume(subject, durable, parse, box.put)
    return box


class Heard(NamedTuple):
    """What a node's agent said on the bus: its workers' reports and its dead letters."""

    reports: Inbox
    letters: Inbox


def agent_env(nats_url: str, redis_url: str, data_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "UNICRON_NODE_ID": NODE,
        "UNICRON_SLOTS": "4",
        "UNICRON_NATS_URL": nats_url,
        "UNICRON_REDIS_URL": redis_url,
        "UNICRON_DATA_DIR": str(data_dir),
        "UNICRON_HEARTBEAT_INTERVAL_S": "0.2",
        "UNICRON_ENTRYPOINTS": json.dumps({"gpt": FAKE_WORKER}),
        "UNICRON_SPARE_MODULE": FAKE_WORKER,  # a stdlib spare: it starts without torch
    }


async def node_record(state: StateStore, match: Callable[[NodeRecord], bool]) -> NodeRecord:
    """The node's record once it matches (Redis may be coming back meanwhile)."""
    async with asyncio.timeout(10):
        while True:
            with contextlib.suppress(RedisConnectionError):
                node = await state.get_node(NODE)
                if node is not None and match(node):
                    return node
            await asyncio.sleep(0.05)
