"""Transitions that keep healthy workers alive (docs/design.md §5), with real worker processes and
the test as agent and executor: in-place regroups, joiners that take the state from a live
peer, partial-step reuse, warm spares — and training exactly as if nothing had happened."""

from __future__ import annotations

import time

import torch
from unicron.shared.contracts.models import JobSpec
from unicron.trainer import checkpoint
from unicron.trainer.gpt import make_optimizer, train_step
from unicron.trainer.ledger import read_ledger
from unicron.trainer.model import build_model

from tests.trainer.harness import make_spec
from tests.trainer.transitions import executor


def reference(spec: JobSpec) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The failure-free run: one process, the whole global batch (equal to any world size,
    see test_workers)."""
    model = build_model(spec.model, spec.seed)
    optimizer = make_optimizer(model)
    losses = [train_step(model, optimizer, spec, s, 0, 1, None) for s in range(1, spec.steps + 1)]
    return model.state_dict(), losses


def assert_same_model(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for name, want in expected.items():
        rel = float((got[name] - want).abs().max() / want.abs().max().clamp_min(1e-12))
        assert rel <= 1e-5, (name, rel)


def test_regroups_shrink_and_grow_train_exactly_like_a_run_without_faults() -> None:
    spec = make_spec(steps=40, global_batch=16, micro_batch=2, checkpoint_every=1000)
    with executor(spec) as (ex, store):
        workers = [ex.start(ex.launch(1, rank, 4)) for rank in range(4)]
        spares = [ex.start_spare() for _ in range(3)]
        hellos = lambda got: sum(m["kind"] == "hello" for m in got) == 7  # noqa: E731
        ex.agent.collect(hellos, local=True, timeout_s=60)
        store.start()  # type: ignore[attr-defined]
        ex.members = dict(enumerate(workers))

        # SEV3, reattempt in place: the same four ranks under generation 2. Rank 0 hears it
        # first and leaves mid-step; the others fail in the all-reduce, park, and follow.
        ex.until(lambda _: ex.latest_step() >= 2)
        ex.regroup(2, {0: 0}, world=4)
        ex.failed(1, {1, 2, 3})
        ex.regroup(2, {1: 1, 2: 2, 3: 3}, world=4)
        sev3 = ex.regrouped(2, 4)
        assert {r["state_source"] for r in sev3.values()} == {"memory"}
        assert sum(r["reused_micro_batches"] for r in sev3.values()) > 0

        # SEV2: rank 1 is killed at the start of a step; the survivors keep their partial
        # sums, a warm spare joins as rank 3 and takes the state from rank 0.
        ex.crash(1, at_step=ex.latest_step() + 3)
        ex.failed(2, {0, 2, 3})
        ex.use_spare(spares[0], ex.launch(3, 3, 4, source=0))
        ex.regroup(3, {0: 0, 2: 1, 3: 2}, world=4, source=0)
        sev2 = ex.regrouped(3, 4)
        assert sev2[3]["state_source"] == "peer" and sev2[3]["pid"] == spares[0]
        assert {sev2[r]["state_source"] for r in (0, 1, 2)} == {"memory"}
        # Each survivor had summed its 2 of the 8 micro-batches: 6 kept, 2 redone.
        assert sum(r["reused_micro_batches"] for r in sev2.values()) == 6
        assert len({r["resumed_step"] for r in sev2.values()}) == 1

        # SEV1: two ranks lost at once; the job shrinks to two workers mid-step.
        crash_at = ex.latest_step() + 3
        ex.crash(1, at_step=crash_at)
        ex.crash(3, at_step=crash_at)
        ex.failed(3, {0, 2})
        ex.regroup(4, {0: 0, 2: 1}, world=2)
        sev1 = ex.regrouped(4, 2)
        assert sum(r["reused_micro_batches"] for r in sev1.values()) == 4

        # Grow back to four while stepping: two warm spares join, the survivors regroup.
        ex.until(lambda _: any(r["generation"] == 4 for r in ex.of("step_completed")))
        ex.use_spare(spares[1], ex.launch(5, 2, 4, source=0))
        ex.use_spare(spares[2], ex.launch(5, 3, 4, source=0))
        ex.regroup(5, {0: 0, 1: 1}, world=4, source=0)
        grow = ex.regrouped(5, 4)
        assert grow[2]["state_source"] == grow[3]["state_source"] == "peer"
        assert ex.latest_step() < spec.steps, "the job ended before the last transition"

        final = list(ex.members.values())
        assert ex.finish(final) == [0, 0, 0, 0]
        found = checkpoint.load_latest(ex.checkpoint_dir)
        ledger = read_ledger(ex.checkpoint_dir)
        steps = ex.of("step_completed")
        regrouped = ex.of("worker_regrouped")

    expected, losses = reference(spec)
    assert found is not None and found[0] == spec.steps
    assert_same_model(found[1]["model"], expected)
    # Every sample of every step went into the update exactly once, across five generations.
    assert [e.step for e in ledger] == list(range(1, spec.steps + 1))
    assert all(e.counted == [1] * spec.micro_batches for e in ledger)
    assert {e.generation for e in ledger} == {1, 2, 3, 4, 5}
    assert {e.world_size for e in ledger} == {2, 4}
    for report in steps:
        assert abs(report["loss"] - losses[report["step"] - 1]) < 1e-4
    for report in regrouped:
        print(
            f"gen {report['generation']} rank {report['rank']}: regroup "
            f"{report['regroup_s'] * 1e3:.1f} ms, transfer {report['state_transfer_s'] * 1e3:.1f}"
            f" ms from {report['state_source']}, reused {report['reused_micro_batches']}"
        )


def test_a_joiner_whose_source_dies_mid_transfer_falls_back_to_the_disk_checkpoint() -> None:
    spec = make_spec(steps=8, checkpoint_every=1000)
    with executor(spec) as (ex, store):
        # The job's newest checkpoint is of step 3; its live state is further on.
        model = build_model(spec.model, spec.seed)
        optimizer = make_optimizer(model)
        for step in (1, 2, 3):
            train_step(model, optimizer, spec, step, 0, 1, None)
        checkpoint.save(ex.checkpoint_dir, 3, checkpoint.capture(model, optimizer, 3))
        store.start()  # type: ignore[attr-defined]
        source = ex.launch(2, 0, 2)
        ex.start(source, module="tests.trainer.dying_source", UNICRON_TEST_NEXT_STEP="6")
        joiner = ex.start(ex.launch(2, 1, 2, source=0))
        ex.until(lambda got: any(r["kind"] == "worker_exception" for r in got))
        (fallback,) = ex.of("worker_regrouped", 2)
        assert fallback["state_source"] == "disk" and fallback["resumed_step"] == 4
        assert fallback["pid"] == joiner
        (failure,) = ex.of("worker_exception", 2)
        assert failure["category"] == "connection_reset"

        # It parked with the disk state; regrouped alone it trains on to the end.
        ex.members = {1: joiner}
        ex.regroup(3, {1: 0}, world=1)
        (alone,) = ex.regrouped(3, 1).values()
        assert alone["state_source"] == "memory" and alone["resumed_step"] == 4
        assert ex.finish([joiner]) == [0]
        found = checkpoint.load_latest(ex.checkpoint_dir)
    expected, _ = reference(spec)
    assert found is not None and found[0] == spec.steps
    assert_same_model(found[1]["model"], expected)


def test_a_warm_spare_turns_into_a_worker_when_sent_a_launch() -> None:
    spec = make_spec(steps=3, checkpoint_every=1000)
    with executor(spec) as (ex, store):
        store.start()  # type: ignore[attr-defined]
        spare = ex.start_spare()
        (hello,) = ex.agent.collect(lambda got: bool(got), local=True, timeout_s=60)
        assert hello == {"kind": "hello", "job_id": "", "generation": -1, "rank": -1}
        sent = time.perf_counter()
        ex.use_spare(spare, ex.launch(1, 0, 1))
        ex.until(lambda got: len(got) == spec.steps)
        first_step_s = time.perf_counter() - sent
        assert ex.finish([spare]) == [0]
    # The only process there is: the spare, now rank 0 of generation 1.
    assert [(r["kind"], r["step"], r["rank"]) for r in ex.reports] == [
        ("step_completed", s, 0) for s in (1, 2, 3)
    ]
    print(f"spare: launch sent -> 3 steps done in {first_step_s:.2f} s")
