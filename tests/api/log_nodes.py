"""Stand-ins for the agents' log servers in the API and CLI tests: the real ``LogServer`` on
the real bus, over log files the test writes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from unicron.services.agent.logs import LogServer
from unicron.services.agent.supervisor import WorkerKey
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.logs import LogsReply, LogsRequest
from unicron.shared.contracts.models import NodeRecord
from unicron.shared.store.state import StateStore

JOB = "job-logs"


class Node:
    """One node's log server, as its agent runs it, over files the test writes."""

    def __init__(self, root: Path, node_id: str) -> None:
        self.root = root / node_id
        self.alive: set[WorkerKey] = set()
        self.server = LogServer(node_id, self.path, lambda key: key in self.alive)
        self.followed = asyncio.Event()  # a request from an offset came: the API follows
        answer = self.server.answer

        async def watched(request: LogsRequest) -> LogsReply:
            if request.offset is not None:
                self.followed.set()
            return await answer(request)

        self.server.answer = watched  # type: ignore[method-assign]

    def path(self, key: WorkerKey) -> Path:
        return self.root / key.job_id / f"g{key.generation}-r{key.rank}.log"

    def write(self, generation: int, rank: int, *lines: str, running: bool = True) -> None:
        key = WorkerKey(JOB, generation, rank)
        self.path(key).parent.mkdir(parents=True, exist_ok=True)
        with self.path(key).open("a") as out:
            out.writelines(line + "\n" for line in lines)
        if running:
            self.alive.add(key)
        else:
            self.alive.discard(key)


async def serve_nodes(root: Path, bus: Bus, state: StateStore) -> dict[str, Node]:
    """node-a and node-b answer; node-c is registered but its agent is gone."""
    found = {n: Node(root, n) for n in ("node-a", "node-b")}
    for node_id in ("node-a", "node-b", "node-c"):
        await state.put_node(NodeRecord(id=node_id, slots=2))
    for node in found.values():
        await node.server.serve(bus)
    await bus.nc.flush()
    return found
