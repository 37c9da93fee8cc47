"""The public training API (:mod:`unicron.train`) with a user's own script: real worker
processes heal it like the built-in GPT — exact training across a killed rank, a joiner that
takes the state from a peer, failures reported from the user's own loop body — and a plain
``python`` run outside Unicron trains the same thing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from unicron.shared.contracts.models import JobSpec
from unicron.trainer import checkpoint
from unicron.trainer.ledger import read_ledger
from unicron.trainer.parallel import micro_batches_for
from unicron.trainer.sampling import sample_indices, source_of

from tests.trainer.harness import DISCONNECTED, REPO, make_spec
from tests.trainer.transitions import Executor, executor
from tests.trainer.user_script import dataset

SCRIPT = "tests.trainer.user_script"
# 40 samples, 12 a step: epochs end mid-step; six micro-batches of two.
SPEC = make_spec(steps=12, global_batch=12, micro_batch=2, checkpoint_every=4)


def local_run(spec: JobSpec, out: Path) -> dict[str, torch.Tensor]:
    """The script as a user debugs it: plain ``python``, no agent, one process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICRON_")}
    env.update(USER_SPEC=spec.model_dump_json(), USER_OUT=str(out))
    done = subprocess.run(
        [sys.executable, "-m", SCRIPT], cwd=REPO, env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    weights: dict[str, torch.Tensor] = torch.load(out)
    return weights


def final_model(ex: Executor) -> dict[str, torch.Tensor]:
    found = checkpoint.load_latest(ex.checkpoint_dir)
    assert found is not None and found[0] == SPEC.steps
    model: dict[str, torch.Tensor] = found[1]["model"]
    return model


def assert_close(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, want in expected.items():
        assert float((got[name] - want).abs().max()) <= 1e-5, name


def assert_every_sample_once(ex: Executor, generations: set[int]) -> None:
    ledger = read_ledger(ex.checkpoint_dir)
    assert [e.step for e in ledger] == list(range(1, SPEC.steps + 1))
    assert all(e.counted == [1] * SPEC.micro_batches for e in ledger)
    assert {e.generation for e in ledger} == generations


def test_a_user_script_trains_exactly_through_a_killed_rank_and_a_joiner(tmp_path: Path) -> None:
    expected = local_run(SPEC, tmp_path / "local.pt")

    with executor(SPEC) as (ex, store):
        workers = [ex.start(ex.launch(1, rank, 2), module=SCRIPT) for rank in range(2)]
        store.start()  # type: ignore[attr-defined]
        assert ex.finish(workers) == [0, 0]
        assert_close(final_model(ex), expected)
        assert_every_sample_once(ex, {1})

    with executor(SPEC) as (ex, store):
        ex.members = {rank: ex.start(ex.launch(1, rank, 3), module=SCRIPT) for rank in range(3)}
        store.start()  # type: ignore[attr-defined]
        ex.crash(1, at_step=5)  # SIGKILL at the start of step 5, mid-training
        ex.failed(1, {0, 2})  # the survivors lose it in step 5's all-reduce and park
        joiner = ex.start(ex.launch(2, 2, 3, source=0), module=SCRIPT)
        ex.regroup(2, {0: 0, 2: 1}, world=3, source=0)
        regrouped = ex.regrouped(2, 3)
        assert regrouped[2]["pid"] == joiner and regrouped[2]["state_source"] == "peer"
        assert {regrouped[r]["state_source"] for r in (0, 1)} == {"memory"}
        # Survivors kept their step-5 micro-batches (two each of six); only rank 1's redone.
        assert sum(r["reused_micro_batches"] for r in regrouped.values()) == 4
        assert {r["resumed_step"] for r in regrouped.values()} == {5}
        assert ex.finish(list(ex.members.values())) == [0, 0, 0]
        assert_close(final_model(ex), expected)
        assert_every_sample_once(ex, {1, 2})


def test_an_exception_in_the_user_loop_body_is_reported_once_before_exit_1() -> None:
    spec = make_spec(steps=6, global_batch=4, micro_batch=2)
    with executor(spec) as (ex, store):
        pid = ex.start(ex.launch(1, 0, 1), module=SCRIPT, USER_FAIL_AT="0:3")
        store.start()  # type: ignore[attr-defined]
        ex.until(lambda got: any(r["kind"] == "worker_exception" for r in got))
        assert ex.finish([pid]) == [1]
        ex.agent.collect(lambda got: any(m["kind"] == DISCONNECTED for m in got), local=True)
        while not ex.agent.lines.empty():
            ex.reports.append(ex.agent.lines.get())
    (failure,) = ex.of("worker_exception")
    assert failure["category"] == "oom" and failure["exc_type"] == "OutOfMemoryError"
    assert failure["step"] == 3 and failure["pid"] == pid
    assert "Tried to allocate 2.00 GiB" in failure["message"]
    assert [r["step"] for r in ex.of("step_completed")] == [1, 2]
    assert ex.stderr[pid].count("Traceback") == 1  # the user still sees it, once


def test_a_micro_batch_is_the_same_samples_for_any_world_size_and_an_epoch_uses_each_once() -> None:
    data = dataset()
    spec = SPEC.model_copy(update={"global_batch": 8, "micro_batch": 2, "seed": 3})
    seen: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for world in (1, 2, 3):
        for rank in range(world):
            fetch = source_of(data, spec, torch.device("cpu"))  # as in rank's own process
            for index in micro_batches_for(rank, world, spec.micro_batches):
                seen.setdefault(index, []).append(fetch(4, index))
    assert sorted(seen) == list(range(spec.micro_batches))
    for batches in seen.values():
        assert len(batches) == 3 and batches[0][0].shape == (2, 8)
        assert all(
            torch.equal(b[0], batches[0][0]) and torch.equal(b[1], batches[0][1]) for b in batches
        )
    # 40 samples at 8 a step: five steps make an epoch, each sample exactly once, each epoch
    # in its own order.
    epochs = [
        [i for step in steps for m in range(4) for i in sample_indices(spec, 40, step, m)]
        for steps in (range(1, 6), range(6, 11))
    ]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(40))
    assert epochs[0] != epochs[1]
    # Twelve a step: an epoch ends mid-step and the next one starts in the same micro-batch.
    spec12 = spec.model_copy(update={"global_batch": 12})
    positions = [
        i for step in (1, 2, 3, 4) for m in range(6) for i in sample_indices(spec12, 40, step, m)
    ]
    assert sorted(positions[:40]) == list(range(40)) and len(set(positions[40:])) == 8
