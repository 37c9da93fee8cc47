"""One fault, one failure: the detector names the root cause among the reports a fault causes."""

from __future__ import annotations

import asyncio

import pytest
from unicron.services.detector.correlate import Correlator
from unicron.services.detector.signals import Candidate
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import Job, NodeState
from unicron.shared.contracts.reports import WorkerException, WorkerExited, WorkerHung
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind
from unicron.shared.store.state import StateStore

from tests.detector.conftest import Cluster, next_event, no_event

FOUR_RANKS = ["node-0", "node-0", "node-1", "node-1"]
EXITED, RESET = FailureCategory.EXITED_ABNORMALLY, FailureCategory.CONNECTION_RESET


def reset_by_peer(job: str, rank: int, node: str, gen: int = 1) -> WorkerException:
    return WorkerException(
        node_id=node, job_id=job, generation=gen, rank=rank, pid=1000 + rank,
        exc_type="RuntimeError", category="connection_reset", parked=True,
        message="[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
        "[127.0.0.1]:41234: Connection reset by peer",
    )  # fmt: skip


def exited(
    job: str, rank: int, node: str, exit_code: int | None, signal: int | None = None, gen: int = 1
) -> WorkerExited:
    """Rank ``rank`` of generation ``gen`` ended (its pid, as in the other reports: 1000 +
    rank)."""
    return WorkerExited(
        node_id=node, job_id=job, generation=gen, rank=rank, pid=1000 + rank,
        exit_code=exit_code, signal=signal,
    )  # fmt: skip


async def on_two_nodes(cluster: Cluster, job: str) -> None:
    """Nodes node-0 and node-1, and ``job`` with its four ranks on them (``FOUR_RANKS``)."""
    for node in ("node-0", "node-1"):
        await cluster.add_node(node)
    await cluster.add_job(job, FOUR_RANKS)


async def test_killed_rank_is_reported_once_not_its_peers(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    await on_two_nodes(cluster, "job-a")
    for rank in (0, 2, 3):
        await bus.publish_report(reset_by_peer("job-a", rank, FOUR_RANKS[rank]))
    await bus.publish_report(exited("job-a", 1, "node-0", None, signal=9))
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["kind"], failure["rank"], failure["severity"], failure["action"]) == (
        "crash", 1, "SEV2", "restart",
    )  # fmt: skip
    for rank in (0, 2, 3):  # the survivors exit after their errors: still the same fault
        await bus.publish_report(exited("job-a", rank, FOUR_RANKS[rank], 1))
    await no_event(events, "failure.detected", within_s=1.0)


async def test_connection_errors_alone_are_a_sev3_reattempt(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    await on_two_nodes(cluster, "job-b")
    await bus.publish_report(reset_by_peer("job-b", 2, "node-1"))
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["category"], failure["severity"], failure["action"]) == (
        "connection_reset", "SEV3", "reattempt",
    )  # fmt: skip
    job = await state.get_job("job-b")
    assert job is not None and job.state.value == "RECOVERING"
    assert job.last_failure is not None and job.last_failure.category == "connection_reset"


async def test_a_network_error_the_rank_exits_on_is_restarted_not_reattempted(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    # Raised by the rank's own code, not in a collective: it does not park but exits, so a
    # reattempt in place would wait for a rank that is gone.
    await cluster.add_node("node-0")
    await cluster.add_job("job-x", ["node-0", "node-0"])
    exiting = reset_by_peer("job-x", 1, "node-0").model_copy(update={"parked": False})
    await bus.publish_report(exiting)
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["rank"], failure["severity"], failure["action"]) == (1, "SEV3", "restart")


async def test_an_exit_with_code_1_is_blamed_before_its_parked_peers(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    await on_two_nodes(cluster, "job-e")
    for rank in (0, 2, 3):  # alive and parked, the in-band reports come first
        await bus.publish_report(reset_by_peer("job-e", rank, FOUR_RANKS[rank]))
    await bus.publish_report(exited("job-e", 1, "node-0", 1))
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["kind"], failure["rank"], failure["action"]) == ("exit", 1, "restart")


async def test_an_exit_with_code_1_is_blamed_before_a_peer_silent_in_the_collective(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    await cluster.add_node("node-0")
    await cluster.add_job("job-w", ["node-0", "node-0"])
    await bus.publish_report(
        WorkerHung(node_id="node-0", job_id="job-w", generation=1, rank=0, pid=1000,
                   silent_s=0.7, threshold_s=0.6, mean_iteration_s=0.05, process_state="S",
                   phase="collective")
    )  # fmt: skip
    await bus.publish_report(exited("job-w", 1, "node-0", 1))
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["kind"], failure["rank"]) == ("exit", 1)


async def test_in_band_exception_keeps_its_category(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    await cluster.add_node("node-0")
    await cluster.add_job("job-c", ["node-0", "node-0"])
    await bus.publish_report(
        WorkerException(node_id="node-0", job_id="job-c", generation=1, rank=0, pid=1000,
                        exc_type="RuntimeError", category="ecc",
                        message="CUDA error: uncorrectable ECC error encountered")
    )  # fmt: skip
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["kind"], failure["category"], failure["severity"], failure["action"]) == (
        "exception", "ecc", "SEV1", "reconfigure",
    )  # fmt: skip
    assert "ECC" in failure["evidence"]["message"]


def hung(job: str, rank: int, node: str, phase: str, state: str = "S") -> WorkerHung:
    return WorkerHung(
        node_id=node, job_id=job, generation=1, rank=rank, pid=1000 + rank, silent_s=0.8,
        threshold_s=0.7, mean_iteration_s=0.06, process_state=state, phase=phase, last_step=30,
    )  # fmt: skip


async def test_hang_names_the_rank_stuck_in_compute(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    await on_two_nodes(cluster, "job-d")
    for rank in (0, 1, 3):
        await bus.publish_report(hung("job-d", rank, FOUR_RANKS[rank], "collective"))
    await bus.publish_report(hung("job-d", 2, "node-1", "compute"))
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["kind"], failure["category"], failure["rank"], failure["severity"]) == (
        "hang", "task_hang", 2, "SEV2",
    )  # fmt: skip
    await no_event(events, "failure.detected", within_s=0.8)


async def test_hang_waits_for_the_stuck_ranks_own_report_after_its_peers(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    # As many peers report as there are nodes: the grace must count ranks, not nodes.
    await on_two_nodes(cluster, "job-w")
    for rank in (1, 3):
        await bus.publish_report(hung("job-w", rank, FOUR_RANKS[rank], "collective"))
    await asyncio.sleep(0.3)  # the stopped rank's agent notices a little later
    await bus.publish_report(hung("job-w", 0, FOUR_RANKS[0], "compute", state="T"))
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["kind"], failure["rank"]) == ("hang", 0)


async def test_stopped_process_is_a_hang_reported_at_once(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    await cluster.add_node("node-0")
    await cluster.add_job("job-e", ["node-0", "node-0"])
    await bus.publish_report(hung("job-e", 1, "node-0", "collective", state="T"))
    failure = (await next_event(events, "failure.detected", timeout_s=1.0)).data
    assert (failure["kind"], failure["rank"]) == ("hang", 1)
    assert failure["evidence"]["process_state"] == "T"


async def test_lost_node_is_the_root_cause_not_the_network(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    await on_two_nodes(cluster, "job-f")
    cluster.kill_agent("node-1")  # heartbeats and pings stop; its workers die with it
    await bus.publish_report(reset_by_peer("job-f", 0, "node-0"))
    lost = (await next_event(events, "node.lost", timeout_s=5.0)).data
    assert lost["node_id"] == "node-1"
    failure = (await next_event(events, "failure.detected", timeout_s=2.0)).data
    assert (failure["kind"], failure["category"], failure["node_id"], failure["severity"]) == (
        "node_lost", "node_down", "node-1", "SEV1",
    )  # fmt: skip
    assert failure["evidence"]["ranks"] == [2, 3]
    node = await state.get_node("node-1")
    assert node is not None and node.state == NodeState.LOST


async def test_report_of_an_old_generation_is_ignored(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    await cluster.add_node("node-0")
    await cluster.add_job("job-g", ["node-0"], generation=3)
    await bus.publish_report(
        WorkerExited(node_id="node-0", job_id="job-g", generation=2, rank=0, pid=1, signal=9,
                     exit_code=None)
    )  # fmt: skip
    await no_event(events, "failure.detected", within_s=0.7)


def crash(job: str, rank: int) -> Candidate:
    return Candidate(job, 2, "node-0", rank, FailureKind.CRASH, EXITED, observed_at=1.0)


async def test_a_fault_seen_while_redis_is_away_is_recorded_when_it_is_back() -> None:
    """The bus hands a report back while its handler hits an outage; the retry must record
    the fault, not find it already done (chaos run: two crashes lost at a Redis restart)."""
    recorded: list[Candidate] = []
    redis_up = False

    async def emit(cause: Candidate) -> bool:
        if not redis_up:
            raise ConnectionError("Error 111 connecting to Redis")
        recorded.append(cause)
        return True

    correlator = Correlator(0.01, emit)
    with pytest.raises(ConnectionError):
        await correlator.add(crash("job-c", 0))
    redis_up = True
    await correlator.add(crash("job-c", 0))  # the bus's retry of the same report
    await correlator.add(crash("job-c", 1))  # a later report of the same fault: done
    assert [(c.job_id, c.rank) for c in recorded] == [("job-c", 0)]


async def test_a_held_secondary_fault_waits_out_an_outage_itself() -> None:
    recorded: list[Candidate] = []
    failures = 0
    done = asyncio.Event()

    async def emit(cause: Candidate) -> bool:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise ConnectionRefusedError()
        recorded.append(cause)
        done.set()
        return True

    correlator = Correlator(0.01, emit)
    reset = Candidate("job-d", 1, "node-0", 2, FailureKind.EXCEPTION, RESET, observed_at=1.0)
    await correlator.add(reset)  # secondary: emitted by its timer, after the window
    await asyncio.wait_for(done.wait(), 10)
    assert failures == 2 and recorded == [reset]
    await correlator.close()


async def test_a_rank_waiting_on_a_slow_peer_is_no_hang_once_the_job_steps_on(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    # Found silent in the all-reduce on a busy node, but its peer was only slow: the job
    # completed the step meanwhile. A real fault later in the generation is still heard.
    await cluster.add_node("node-0")
    await cluster.add_job("job-s", ["node-0", "node-0"], step=40)
    await bus.publish_report(
        WorkerHung(node_id="node-0", job_id="job-s", generation=1, rank=1, pid=1001,
                   silent_s=0.6, threshold_s=0.55, mean_iteration_s=0.03, process_state="S",
                   phase="collective", last_step=40)
    )  # fmt: skip

    def stepped(job: Job) -> None:
        job.step = 41

    await state.update_job("job-s", stepped)
    await no_event(events, "failure.detected", within_s=1.5)
    await bus.publish_report(exited("job-s", 0, "node-0", None, signal=9))
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["kind"], failure["rank"]) == ("crash", 0)


async def test_a_parked_rank_waits_for_the_late_report_of_the_rank_that_left(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent]
) -> None:
    # On a busy node the exit of rank 1 reached the detector after the correlation window;
    # its parked peer named no culprit, so the fault waits for it (chaos run: a SEV3
    # reattempt of the wrong rank, then an 18-s checkpoint fallback).
    await cluster.add_node("node-0")
    await cluster.add_job("job-l", ["node-0", "node-0"])
    await bus.publish_report(reset_by_peer("job-l", 0, "node-0"))
    await asyncio.sleep(0.5)  # the agent of rank 1 is slow to report
    await bus.publish_report(exited("job-l", 1, "node-0", 42))
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["kind"], failure["rank"], failure["action"]) == ("exit", 1, "restart")
