"""A silent node is lost only when corroborated: the rule (``judge``) on each kind of evidence,
and the monitor that gathers it, against agents that answer, agents that do not, and an
observer that doubts its own hearing."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from unicron.services.detector.correlate import Correlator
from unicron.services.detector.nodes import NodeMonitor
from unicron.services.detector.settings import DetectorSettings
from unicron.services.detector.signals import Candidate
from unicron.services.detector.suspicion import (
    AgentAnswer,
    Evidence,
    NodeVerdict,
    Suspicion,
    judge,
)
from unicron.shared.bus.api import EventBus
from unicron.shared.contracts.messages import ping_subject
from unicron.shared.contracts.models import NodeRecord, NodeState, now
from unicron.shared.contracts.reports import WorkerException
from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.shared.store.api import JobStore
from unicron.shared.store.hearing import Hearing

from tests.detector.conftest import Cluster, next_event

SETTINGS = DetectorSettings(heartbeat_interval_s=1.0)  # deadline 3 s, hold 30 s
QUIET = Evidence(
    silent_s=3.1,
    answer=AgentAnswer.NO_ANSWER,
    answer_age_s=0.0,
    reported_s=None,
    observer_doubt=None,
    mass_silence=False,
    peers_cut=False,
)


def _verdict(**changes: Any) -> NodeVerdict:
    return judge(dataclasses.replace(QUIET, **changes), SETTINGS).verdict


@pytest.mark.parametrize(
    ("changes", "verdict"),
    [
        ({}, NodeVerdict.LOST),  # unanswered, nothing else heard: gone
        ({"answer": AgentAnswer.NO_RESPONDERS}, NodeVerdict.LOST),
        ({"answer": AgentAnswer.OTHER_BOOT}, NodeVerdict.LOST),  # the node rebooted
        ({"answer": AgentAnswer.THIS_BOOT}, NodeVerdict.ALIVE),
        # an answer older than a beat says nothing of now: ask again
        ({"answer": AgentAnswer.THIS_BOOT, "answer_age_s": 1.5}, NodeVerdict.UNDECIDED),
        ({"reported_s": 0.3}, NodeVerdict.ALIVE),  # its reports come through its agent
        ({"reported_s": 4.0}, NodeVerdict.LOST),
        ({"observer_doubt": "the detector's own loop ran 2s late"}, NodeVerdict.UNDECIDED),
        ({"answer": AgentAnswer.NO_RESPONDERS, "observer_doubt": "bus"}, NodeVerdict.UNDECIDED),
        ({"answer": AgentAnswer.NOT_ASKED}, NodeVerdict.UNDECIDED),
        ({"mass_silence": True}, NodeVerdict.UNDECIDED),
        ({"mass_silence": True, "peers_cut": True}, NodeVerdict.LOST),
        # no doubt holds past the hold
        ({"observer_doubt": "bus", "silent_s": 33.5}, NodeVerdict.LOST),
        ({"mass_silence": True, "silent_s": 33.5}, NodeVerdict.LOST),
        # but an answer still clears it
        ({"answer": AgentAnswer.THIS_BOOT, "silent_s": 100.0}, NodeVerdict.ALIVE),
    ],
)
def test_each_signal_weighs_as_the_design_says(
    changes: dict[str, Any], verdict: NodeVerdict
) -> None:
    assert _verdict(**changes) == verdict


async def _ignore(_: Candidate) -> bool:
    return True


class Agents:
    """Agents on the bus that answer as told: with their boot, not at all, or not listening."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.mute: set[str] = set()

    async def listen(self, node_id: str, boot_id: str) -> None:
        async def pong(msg: Any) -> None:
            if node_id not in self.mute:
                await msg.respond(boot_id.encode())

        await self.bus.nc.subscribe(ping_subject(node_id), cb=pong)  # type: ignore[attr-defined]


def _monitor(bus: EventBus, state: JobStore) -> NodeMonitor:
    settings = DetectorSettings(heartbeat_interval_s=0.2, ping_timeout_s=0.1)
    hearing = Hearing(settings.node_timeout_s)
    hearing.since = now() - 60  # it has been listening all along
    suspicion = Suspicion(bus, settings)
    return NodeMonitor(bus, state, Correlator(0.05, _ignore), hearing, suspicion)


async def _silent_nodes(state: JobStore, ids: list[str], silent_s: float) -> None:
    for node_id in ids:
        node = NodeRecord(id=node_id, slots=2, boot_id=f"boot-{node_id}")
        node.last_heartbeat = now() - silent_s
        await state.put_node(node)


async def _states(state: JobStore, ids: list[str]) -> list[NodeState]:
    return [n.state for n in await state.get_nodes(ids)]


async def test_a_silent_node_whose_agent_answers_is_not_lost(
    bus: EventBus, state: JobStore
) -> None:
    agents = Agents(bus)
    await agents.listen("node-0", "boot-node-0")
    await agents.listen("node-1", "boot-node-1")
    await agents.listen("node-2", "an-earlier-boot")  # restarted: its record's boot is gone
    await _silent_nodes(state, ["node-0", "node-1", "node-2", "node-3"], silent_s=1.0)
    await _silent_nodes(state, ["node-4", "node-5", "node-6", "node-7"], silent_s=0.0)
    agents.mute.add("node-1")
    monitor = _monitor(bus, state)
    # node-3: nobody listens on its subject
    assert sorted(await monitor.check()) == ["node-1", "node-2", "node-3"]
    assert await _states(state, ["node-0"]) == [NodeState.READY]
    await monitor.suspicion.close()


async def test_many_nodes_silent_and_unanswered_at_once_wait_unless_their_peers_confirm(
    bus: EventBus, state: JobStore
) -> None:
    """Four of five silent together, listening but not answering: the observer's or the bus's
    fault (Kubernetes' unhealthy zone); a peer's connection error to one of them confirms it."""
    agents = Agents(bus)
    silent = ["node-0", "node-1", "node-2", "node-3"]
    for node_id in silent:
        await agents.listen(node_id, f"boot-{node_id}")
        agents.mute.add(node_id)
    await _silent_nodes(state, silent, silent_s=1.0)
    await _silent_nodes(state, ["node-4"], silent_s=0.0)
    await Cluster(bus, state).add_job("job-a", ["node-3", "node-4"])
    monitor = _monitor(bus, state)
    assert await monitor.check() == []
    assert await _states(state, silent) == [NodeState.READY] * 4
    monitor.suspicion.heard_exception(
        WorkerException(
            node_id="node-4", job_id="job-a", generation=1, rank=1, pid=1, exc_type="RuntimeError",
            message="Connection reset by peer", category=FailureCategory.CONNECTION_RESET,
        )
    )  # fmt: skip
    await asyncio.sleep(0.25)  # the previous answers go stale (older than a beat of 0.2 s)
    assert await monitor.check() == ["node-3"]
    await monitor.suspicion.close()


async def test_an_observer_that_ran_late_or_lost_its_bus_judges_no_one(
    bus: EventBus, state: JobStore
) -> None:
    await _silent_nodes(state, ["node-0"], silent_s=1.0)  # nobody listens: lost, if judged
    monitor = _monitor(bus, state)
    monitor.suspicion.woke(late_s=2.0)  # the detector's loop was starved of CPU
    assert await monitor.check() == []
    assert await _states(state, ["node-0"]) == [NodeState.READY]
    fresh = _monitor(bus, state)
    assert await fresh.check() == ["node-0"]
    await monitor.suspicion.close()
    await fresh.suspicion.close()


async def test_a_node_silent_in_redis_but_heard_on_the_bus_keeps_its_jobs(
    cluster: Cluster, events: asyncio.Queue[Any], state: JobStore
) -> None:
    """node-0's heartbeats stop landing while its agent lives; node-1's agent is killed a beat
    later. The first and only loss is node-1's, and node-0 stays READY with its job running."""
    for node_id in ("node-0", "node-1", "node-2"):
        await cluster.add_node(node_id)
    await cluster.add_job("job-a", ["node-0", "node-2"])
    await cluster.add_job("job-b", ["node-1", "node-2"])
    cluster.unheard.add("node-0")
    await asyncio.sleep(0.3)
    cluster.kill_agent("node-1")
    lost = await next_event(events, "node.lost", timeout_s=10.0)
    assert lost.data["node_id"] == "node-1"
    failure = await next_event(events, "failure.detected", timeout_s=5.0)
    assert (failure.data["job_id"], failure.data["node_id"]) == ("job-b", "node-1")
    assert await _states(state, ["node-0"]) == [NodeState.READY]
    job = await state.get_job("job-a")
    assert job is not None and not job.needs_recovery()


class _Link:
    """A bus that is only its connection state (Suspicion reads nothing else of it here)."""

    connected = True


def test_a_detector_whose_bus_was_down_doubts_itself_until_agents_could_resubscribe() -> None:
    link = _Link()
    suspicion = Suspicion(link, SETTINGS)  # type: ignore[arg-type]
    assert suspicion.doubt(100.0) is None  # up since it started
    link.connected = False
    suspicion.observe(101.0)  # a check while it reconnects
    link.connected = True
    suspicion.observe(102.0)  # and the next, once back
    assert suspicion.doubt(103.0) == "the detector's bus reconnected moments ago"
    assert suspicion.doubt(102.0 + SETTINGS.node_timeout_s + 0.1) is None
