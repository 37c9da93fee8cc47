"""A plain script's failure names the rank whose own exception or signal began it. Its peers
exit on the connection error rather than park, and may be heard first: their reports wait,
bounded by ``root_cause_wait_s``, for every rank; a signal is named; a failure of the job's own
code never escalates and never counts against a node."""

from __future__ import annotations

import asyncio

from unicron.services.detector.settings import DetectorSettings
from unicron.services.detector.signals import Candidate, from_exit, root_cause
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import Job, JobSpec
from unicron.shared.contracts.reports import WorkerException, WorkerExited
from unicron.shared.contracts.taxonomy import FailureCategory, FailureKind
from unicron.shared.store.state import StateStore

from tests.detector.conftest import Cluster, next_event, no_event

SCRIPT = JobSpec(name="script", entrypoint=["python", "train.py"], max_restarts=2)
PAIR = ["node-0", "node-1"]
GLOO_CLOSED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:51928. This is typically caused by a remote worker crashing."
)


def peer_error(job: str, rank: int, gen: int = 1) -> WorkerException:
    return WorkerException(
        node_id=PAIR[rank], job_id=job, generation=gen, rank=rank, pid=1000 + rank,
        exc_type="RuntimeError", category="connection_reset", message=GLOO_CLOSED,
    )  # fmt: skip


def raised(job: str, rank: int, gen: int = 1) -> WorkerException:
    return WorkerException(
        node_id=PAIR[rank], job_id=job, generation=gen, rank=rank, pid=1000 + rank,
        exc_type="ValueError", category="software_other", message="bad batch shape (4, 7)",
    )  # fmt: skip


def exited(job: str, rank: int, code: int | None = 1, signal: int | None = None) -> WorkerExited:
    return WorkerExited(node_id=PAIR[rank], job_id=job, generation=1, rank=rank,
                        pid=1000 + rank, exit_code=code, signal=signal)  # fmt: skip


async def script_job(cluster: Cluster, job_id: str) -> None:
    for node in PAIR:
        await cluster.add_node(node)
    await cluster.add_job(job_id, PAIR, spec=SCRIPT)


async def test_the_rank_that_raised_is_named_though_its_peer_was_heard_first(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    await script_job(cluster, "job-p")
    await bus.publish_report(peer_error("job-p", 0))
    await bus.publish_report(exited("job-p", 0))
    await no_event(events, "failure.detected", within_s=1.0)  # rank 1 has not spoken yet
    await bus.publish_report(exited("job-p", 1))  # its exit before its exception
    await bus.publish_report(raised("job-p", 1))
    failure = (await next_event(events, "failure.detected")).data
    assert (failure["rank"], failure["exc_type"], failure["category"]) == (
        1, "ValueError", "software_other",
    )  # fmt: skip
    assert (failure["severity"], failure["action"]) == ("SEV2", "restart")
    job = await state.get_job("job-p")
    assert job is not None and job.code_failures == 1


async def test_a_rank_that_never_reports_is_waited_for_no_longer_than_the_bound(
    cluster: Cluster,
    bus: Bus,
    events: asyncio.Queue[CloudEvent],
    detector_settings: DetectorSettings,
) -> None:
    detector_settings.root_cause_wait_s = 1.0
    await script_job(cluster, "job-b")
    await bus.publish_report(peer_error("job-b", 0))
    await no_event(events, "failure.detected", within_s=0.5)
    failure = (await next_event(events, "failure.detected", timeout_s=3.0)).data
    assert (failure["rank"], failure["category"]) == (0, "connection_reset")


async def test_a_signal_is_named_and_only_one_of_its_own_is_the_scripts_fault(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    for job_id, signal in (("job-segv", 11), ("job-oom", 9)):
        await script_job(cluster, job_id)
        await bus.publish_report(peer_error(job_id, 0))
        await bus.publish_report(exited(job_id, 1, code=None, signal=signal))
        failure = (await next_event(events, "failure.detected")).data
        assert (failure["rank"], failure["kind"], failure["severity"]) == (1, "crash", "SEV2")
        job = await state.get_job(job_id)
        assert job is not None and job.last_failure is not None
        assert job.last_failure.exc_type == failure["exc_type"]
        if signal == 11:
            assert (failure["exc_type"], failure["category"]) == ("SIGSEGV", "software_other")
            assert "killed by SIGSEGV" in failure["message"] and job.code_failures == 1
        else:
            assert (failure["exc_type"], failure["category"]) == ("SIGKILL", "exited_abnormally")
            assert "OOM killer" in failure["message"] and job.code_failures == 0


async def test_the_scripts_own_failure_does_not_escalate(
    cluster: Cluster, bus: Bus, events: asyncio.Queue[CloudEvent], state: StateStore
) -> None:
    await script_job(cluster, "job-e")
    for generation in (1, 2):
        if generation == 2:  # restarted

            def restarted(job: Job) -> None:
                job.generation = 2

            await state.update_job("job-e", restarted)
        await bus.publish_report(raised("job-e", 1, gen=generation))
        failure = (await next_event(events, "failure.detected")).data
        assert failure["generation"] == generation
        assert (failure["severity"], failure["action"]) == ("SEV2", "restart")
        assert "escalated_from" not in failure["evidence"]


def candidate(rank: int, kind: FailureKind, category: str, **evidence: object) -> Candidate:
    return Candidate("job", 1, "node-0", rank, kind, FailureCategory(category),
                     observed_at=1.0, evidence={"pid": 1000 + rank, **evidence})  # fmt: skip


def test_an_exit_gives_way_to_the_exception_of_its_own_process() -> None:
    ex, crash, exit_ = FailureKind.EXCEPTION, FailureKind.CRASH, FailureKind.EXIT
    # a survivor aborted after an NCCL error is that error; the other rank's plain exit wins
    survivor = [candidate(0, ex, "nccl_error"), candidate(0, crash, "software_other", signal=6)]
    culprit = candidate(1, exit_, "exited_abnormally", exit_code=1)
    assert root_cause([*survivor, culprit]) is culprit
    # a rank that raised, then aborted in teardown, is named with its exception
    own = candidate(1, ex, "software_other", exc_type="ValueError")
    aborted = candidate(1, crash, "software_other", signal=6)
    assert root_cause([candidate(0, ex, "connection_reset"), aborted, own]) is own
    # a parked rank said it lives on: its exit after that is what happened, a gone rank
    parked = candidate(0, ex, "connection_reset", parked=True)
    gone = candidate(0, exit_, "exited_abnormally", exit_code=1)
    assert root_cause([parked, gone]) is gone


def test_signals_are_named_and_classified() -> None:
    segv = from_exit(exited("job", 1, code=None, signal=11))
    kill = from_exit(exited("job", 1, code=None, signal=9))
    assert segv is not None and kill is not None
    assert (segv.category, segv.evidence["exc_type"], segv.secondary) == (
        FailureCategory.SOFTWARE_OTHER, "SIGSEGV", True,
    )  # fmt: skip
    assert (kill.category, kill.evidence["exc_type"], kill.secondary) == (
        FailureCategory.EXITED_ABNORMALLY, "SIGKILL", False,
    )  # fmt: skip
