"""A rank lost mid-step and healed in place leaves no trace in the training: the job ends with
the very parameters, bit for bit, of a run without faults on as many ranks — not merely close
ones, since a model with ReLUs trained by Adam can turn one step's rounding difference into
a large parameter difference later on. Real worker processes, the test as agent and executor."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from unicron.shared.contracts.messages import FaultKind, FaultSpec
from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.workerchannel import FaultDirective
from unicron.trainer import checkpoint
from unicron.trainer.gpt import loss_of, make_optimizer
from unicron.trainer.model import build_model
from unicron.trainer.parallel import micro_batches_for

from tests.trainer.harness import make_spec
from tests.trainer.transitions import executor

WORLD = 2


@contextmanager
def one_thread() -> Iterator[None]:
    """Compute like a worker, which runs on one thread: a kernel's sums may be split
    differently over more threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def failure_free(spec: JobSpec) -> dict[str, torch.Tensor]:
    """The job on ``WORLD`` ranks without faults, in this process: each rank sums the gradients
    of its micro-batches in order, and the ranks' sums are added as a two-rank all-reduce adds
    them (a + b, the same either way round); dividing by a power of two is exact."""
    model = build_model(spec.model, spec.seed)
    optimizer = make_optimizer(model)
    loss = loss_of(model, spec)
    params = list(model.parameters())
    with one_thread():
        for step in range(1, spec.steps + 1):
            sums = []
            for rank in range(WORLD):
                optimizer.zero_grad(set_to_none=True)
                for index in micro_batches_for(rank, WORLD, spec.micro_batches):
                    torch.autograd.backward(loss(step, index))
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                sums.append(torch.cat([g.reshape(-1) for g in grads]))
            mean = (sums[0] + sums[1]) / spec.micro_batches
            offset = 0
            for param in params:
                param.grad = mean[offset : offset + param.numel()].view_as(param).clone()
                offset += param.numel()
            optimizer.step()
    return model.state_dict()


def crash(rank: int, at_step: int) -> dict[str, object]:
    fault = FaultSpec(rank=rank, kind=FaultKind.CRASH, at_step=at_step)
    return FaultDirective(fault=fault).model_dump(mode="json")


def test_a_job_healed_mid_step_ends_with_the_bits_of_a_run_without_faults() -> None:
    spec = make_spec(steps=12, checkpoint_every=1000)  # 4 micro-batches a step
    assert spec.micro_batches == 4
    with executor(spec) as (ex, store):
        workers = [ex.start(ex.launch(1, rank, WORLD)) for rank in range(WORLD)]
        spares = [ex.start_spare() for _ in range(2)]
        ex.agent.collect(lambda got: len(got) == 4, local=True, timeout_s=120)  # hellos
        # Armed before the first step, so each strikes at the start of its step while the
        # peer sums its own share of that step and then fails in the all-reduce.
        ex.agent.send_to_pid(crash(1, at_step=3), workers[1])
        ex.agent.send_to_pid(crash(0, at_step=8), workers[0])
        store.start()  # type: ignore[attr-defined]
        ex.members = dict(enumerate(workers))

        # Rank 1 dies in step 3; rank 0 keeps its sum of micro-batches 0 and 2, and a spare
        # joins as rank 1.
        ex.failed(1, {0})
        ex.use_spare(spares[0], ex.launch(2, 1, WORLD, source=0))
        ex.regroup(2, {0: 0}, world=WORLD, source=0)
        first = ex.regrouped(2, WORLD)
        assert [first[r]["reused_micro_batches"] for r in (0, 1)] == [2, 0]

        # Rank 0 dies in step 8; the spare, rank 1 until now, keeps its sum of micro-batches
        # 1 and 3 as the new rank 0, and another spare joins as rank 1.
        ex.failed(2, {1})
        ex.use_spare(spares[1], ex.launch(3, 1, WORLD, source=0))
        ex.regroup(3, {1: 0}, world=WORLD, source=0)
        second = ex.regrouped(3, WORLD)
        assert [second[r]["resumed_step"] for r in (0, 1)] == [8, 8]
        assert [second[r]["reused_micro_batches"] for r in (0, 1)] == [2, 0]

        assert ex.finish(list(ex.members.values())) == [0, 0]
        found = checkpoint.load_latest(ex.checkpoint_dir)

    assert found is not None and found[0] == spec.steps
    expected = failure_free(spec)
    for name, want in expected.items():
        got = found[1]["model"][name]
        assert torch.equal(got, want), (name, float((got - want).abs().max()))
