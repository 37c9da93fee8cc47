"""Real worker processes, started the way an agent starts them, against a store and an agent
socket hosted by the test."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from unicron.shared.contracts.taxonomy import FailureCategory
from unicron.trainer import checkpoint
from unicron.trainer.gpt import make_optimizer, train_step
from unicron.trainer.model import build_model

from tests.trainer.harness import DISCONNECTED, agent_and_store, make_launch, make_spec, spawn


def finish(procs: list[subprocess.Popen[bytes]], timeout_s: float = 60) -> list[int]:
    codes = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        codes.append(proc.returncode)
        if proc.returncode not in (0, 1):
            print(err.decode(errors="replace"))
    return codes


def by_kind(reports: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in reports if r["kind"] == kind]


def test_two_workers_train_exactly_like_one_process() -> None:
    spec = make_spec(steps=4, checkpoint_every=100)
    with agent_and_store() as (agent, rendezvous, scratch):
        procs = [
            spawn(make_launch(spec, rendezvous, agent, scratch / "ck", rank, world_size=2))
            for rank in (0, 1)
        ]
        reports = agent.collect(lambda got: len(got) == 2 * spec.steps, timeout_s=60)
        assert finish(procs) == [0, 0]
        local = agent.collect(
            lambda got: sum(m["kind"] == DISCONNECTED for m in got) == 2, local=True
        )
        found = checkpoint.load_latest(scratch / "ck")

    model = build_model(spec.model, spec.seed)
    optimizer = make_optimizer(model)
    losses = [train_step(model, optimizer, spec, s, 0, 1, None) for s in range(1, spec.steps + 1)]

    assert found is not None and found[0] == spec.steps
    for name, expected in model.state_dict().items():
        got = found[1]["model"][name]
        rel = float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-12))
        assert rel <= 1e-5, (name, rel)

    steps = by_kind(reports, "step_completed")
    assert sorted((r["rank"], r["step"]) for r in steps) == [
        (rank, step) for rank in (0, 1) for step in range(1, spec.steps + 1)
    ]
    for report in steps:
        # Every rank reports the global batch's loss, the same a single process computes.
        assert abs(report["loss"] - losses[report["step"] - 1]) < 1e-5
        assert report["iteration_s"] > 0 and report["resumed_from"] is None
        # Its own compute, without the wait for the peer in the all-reduce.
        assert 0 < report["compute_s"] <= report["iteration_s"]
        assert report["job_id"] == "job-t" and report["generation"] == 1

    # What the agent alone sees: who each worker is, then where in each step it is.
    for rank in (0, 1):
        said = [m for m in local if m.get("rank") == rank and m["kind"] != DISCONNECTED]
        assert said[0]["kind"] == "hello" and said[0]["job_id"] == "job-t"
        phases = [(m["phase"], m["step"]) for m in said[1:]]
        expected = [(p, s) for s in range(1, spec.steps + 1) for p in ("compute", "collective")]
        # Rank 0 writes the checkpoint of the last step.
        assert phases == expected + ([("checkpoint", spec.steps)] if rank == 0 else [])


def test_a_failing_rank_reports_its_fault_and_its_peer_reports_the_broken_link() -> None:
    spec = make_spec(steps=50)
    message = "CUDA error: an illegal memory access was encountered"
    fault = json.dumps({"rank": 1, "step": 3, "message": message})
    with agent_and_store() as (agent, rendezvous, scratch):
        procs = [
            spawn(
                make_launch(spec, rendezvous, agent, scratch / "ck", rank, world_size=2),
                module="tests.trainer.fault_worker",
                UNICRON_TEST_FAULT=fault,
                # Rank 0 parks for a regroup that no one sends here; it exits 1 after that.
                UNICRON_PARK_TIMEOUT_S="0.5",
            )
            for rank in (0, 1)
        ]
        reports = agent.collect(
            lambda got: len(by_kind(got, "worker_exception")) == 2, timeout_s=60
        )
        assert finish(procs) == [1, 1]

    failures = {r["rank"]: r for r in by_kind(reports, "worker_exception")}
    assert failures[1]["category"] == FailureCategory.ILLEGAL_MEMORY.value
    assert failures[1]["message"] == message and failures[1]["exc_type"] == "RuntimeError"
    assert failures[1]["pid"] == procs[1].pid
    # Rank 0 was waiting for rank 1 in step 3's all-reduce when rank 1 died.
    assert failures[0]["category"] == FailureCategory.CONNECTION_RESET.value
    assert failures[0]["step"] == failures[1]["step"] == 3
    assert max(r["step"] for r in by_kind(reports, "step_completed")) == 2


def test_a_worker_without_a_valid_launch_says_why_and_exits_2() -> None:
    missing = spawn(None)
    _, err = missing.communicate(timeout=30)
    assert missing.returncode == 2
    assert b"UNICRON_WORKER_LAUNCH is not set" in err

    broken = spawn(None, UNICRON_WORKER_LAUNCH='{"node_id": "n"}')
    _, err = broken.communicate(timeout=30)
    assert broken.returncode == 2
    assert b"not a valid WorkerLaunch" in err and b"rendezvous" in err
