"""Checkpoints: atomic files, pruning, and resuming that continues exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.shared.contracts.workerchannel import WorkerLaunch
from unicron.trainer import checkpoint, gpt
from unicron.trainer.model import GPT

import unicron.train
from tests.trainer.harness import agent_and_store, make_launch, make_spec, next_generation


def run(launch: WorkerLaunch, hook: gpt.Hook | None = None) -> int:
    """The GPT trainer in this process; the exit code a worker process would have."""
    try:
        with unicron.train.init(launch) as session:
            gpt.train(session, hook)
    except Exception:
        return 1
    return 0


def test_save_keeps_the_newest_files_and_load_latest_takes_the_newest(tmp_path: Path) -> None:
    assert checkpoint.load_latest(tmp_path / "missing") is None
    for step in (2, 4, 6, 8, 10):
        checkpoint.save(tmp_path, step, {"step": step, "weights": torch.full((3,), step)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-10.pt", "step-6.pt", "step-8.pt"]
    found = checkpoint.load_latest(tmp_path)
    assert found is not None
    step, state = found
    assert step == 10 and torch.equal(state["weights"], torch.full((3,), 10))


def test_an_unreadable_newest_checkpoint_falls_back_to_the_one_before(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 4, {"step": 4})
    (tmp_path / "step-6.pt").write_bytes(b"truncated")
    found = checkpoint.load_latest(tmp_path)
    assert found is not None and found[0] == 4


def final_state(directory: Path, step: int) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(checkpoint.checkpoint_path(directory, step))
    return state


def test_a_run_stopped_and_resumed_ends_where_an_uninterrupted_run_ends() -> None:
    spec = make_spec(steps=6, checkpoint_every=2)
    with agent_and_store() as (agent, rendezvous, scratch):
        whole = make_launch(spec, rendezvous, agent, scratch / "whole")
        assert run(whole) == 0

        def crash_at_5(session: unicron.train.Run, model: GPT) -> None:
            if session.step == 5:
                raise RuntimeError("injected")

        parts = next_generation(make_launch(spec, rendezvous, agent, scratch / "parts"), 2)
        assert run(parts, crash_at_5) == 1
        assert run(next_generation(parts, 3)) == 0

        reports = agent.collect(lambda got: len(got) == 6 + 4 + 1 + 2, timeout_s=30)
        expected, got = final_state(scratch / "whole", 6), final_state(scratch / "parts", 6)

    failure = next(r for r in reports if r["kind"] == "worker_exception")
    assert failure["step"] == 5 and failure["category"] == FailureCategory.SOFTWARE_OTHER.value
    resumed = [r for r in reports if r["kind"] == "step_completed"][-2:]
    assert [(r["step"], r["resumed_from"]) for r in resumed] == [(5, 4), (6, None)]

    for name, tensor in expected["model"].items():
        assert torch.equal(got["model"][name], tensor), name
    torch.testing.assert_close(got["optimizer"], expected["optimizer"], rtol=0, atol=0)


def test_a_nan_loss_is_reported_as_nan_loss_before_the_run_fails() -> None:
    spec = make_spec(steps=5)

    def poison_at_3(session: unicron.train.Run, model: GPT) -> None:
        if session.step == 3:
            with torch.no_grad():
                model.ln_f.bias.fill_(float("nan"))

    with agent_and_store() as (agent, rendezvous, scratch):
        assert run(make_launch(spec, rendezvous, agent, scratch / "ck"), poison_at_3) == 1
        reports = agent.collect(lambda got: got[-1]["kind"] == "worker_exception" if got else False)
        kept = [step for step, _ in checkpoint.list_checkpoints(scratch / "ck")]
    assert [r["step"] for r in reports] == [1, 2, 3]
    failure = reports[-1]
    assert failure["category"] == FailureCategory.NAN_LOSS.value
    assert failure["exc_type"] == "NonFiniteLossError"
    assert failure["rank"] == 0 and failure["job_id"] == "job-t"
    # The poisoned step was refused before it reached the optimizer or a checkpoint.
    assert kept == [2]


def test_a_finished_job_restarted_does_no_more_steps() -> None:
    spec = make_spec(steps=2)
    with agent_and_store() as (agent, rendezvous, scratch):
        launch = make_launch(spec, rendezvous, agent, scratch / "ck")
        assert run(launch) == 0
        assert run(next_generation(launch, 2)) == 0
        reports = agent.collect(lambda got: len(got) == spec.steps)
        assert agent.lines.empty()
    assert [r["step"] for r in reports] == [1, 2]
