"""A node's step telemetry leaves as one message per step: the batch goes when every local rank
of the job's generation reported, or when the window closes on a lagging one; nothing else waits
behind a batch, and a rank's last step always goes out before its exit."""

from __future__ import annotations

import asyncio

from unicron.services.agent.steps import StepBatcher
from unicron.shared.contracts.reports import AnyReport, StepCompleted, StepsCompleted, WorkerExited


class Out:
    def __init__(self) -> None:
        self.sent: list[AnyReport] = []
        self.arrived = asyncio.Event()

    def report(self, report: AnyReport) -> None:
        self.sent.append(report)
        self.arrived.set()

    def dead_letter(self, subject: str, payload: bytes, reason: str) -> None:
        raise AssertionError("nothing here is a dead letter")


def step(rank: int, number: int, job: str = "job-a") -> StepCompleted:
    return StepCompleted(node_id="n0", job_id=job, generation=2, rank=rank, step=number,
                         loss=0.5, iteration_s=0.1)  # fmt: skip


def ranks_of(report: AnyReport) -> list[tuple[int, int]]:
    assert isinstance(report, StepsCompleted)
    return [(s.rank, s.step) for s in report.steps]


async def test_the_steps_of_all_local_ranks_go_out_in_one_message() -> None:
    out = Out()
    batcher = StepBatcher(out, lambda job, gen: 4 if (job, gen) == ("job-a", 2) else 0, 10.0)
    for rank in (4, 5, 6):
        batcher.report(step(rank, 7))
    assert out.sent == []  # the fourth local rank has not reported yet
    batcher.report(step(7, 7))
    assert len(out.sent) == 1 and ranks_of(out.sent[0]) == [(4, 7), (5, 7), (6, 7), (7, 7)]


async def test_a_lagging_rank_holds_the_batch_no_longer_than_the_window() -> None:
    out = Out()
    batcher = StepBatcher(out, lambda _job, _gen: 4, window_s=0.05)
    batcher.report(step(0, 1))
    batcher.report(step(1, 1))
    await asyncio.wait_for(out.arrived.wait(), 2)
    assert ranks_of(out.sent[0]) == [(0, 1), (1, 1)]


async def test_a_rank_a_step_ahead_sends_the_held_batch_first() -> None:
    out = Out()
    batcher = StepBatcher(out, lambda _job, _gen: 2, window_s=10.0)
    batcher.report(step(0, 1))
    batcher.report(step(0, 2))  # rank 1 never reported step 1
    batcher.report(step(1, 2))
    assert [ranks_of(r) for r in out.sent] == [[(0, 1)], [(0, 2), (1, 2)]]


async def test_an_exit_goes_out_after_the_steps_held_before_it() -> None:
    out = Out()
    batcher = StepBatcher(out, lambda _job, _gen: 2, window_s=10.0)
    batcher.report(step(0, 100))  # the job's last step; rank 1's is still to come
    batcher.report(WorkerExited(node_id="n0", job_id="job-a", generation=2, rank=0, pid=1,
                                exit_code=0))  # fmt: skip
    assert ranks_of(out.sent[0]) == [(0, 100)]
    assert isinstance(out.sent[1], WorkerExited)


async def test_jobs_are_batched_apart() -> None:
    out = Out()
    batcher = StepBatcher(out, lambda _job, _gen: 1, window_s=10.0)
    batcher.report(step(0, 3, job="job-a"))
    batcher.report(step(0, 9, job="job-b"))
    assert [r.job_id for r in out.sent] == ["job-a", "job-b"]
