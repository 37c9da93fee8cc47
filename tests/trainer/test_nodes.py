"""No shared filesystem: every node keeps its own copy of each checkpoint, written once, and a
restart continues from the newest copy whichever node holds it."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

from unicron.trainer import checkpoint

from tests.trainer.harness import agent_and_store, make_launch, make_spec, next_generation
from tests.trainer.nodes import assert_same_bits, resumed_from, run_ranks, state_of


def test_the_first_of_many_claims_on_a_node_wins_and_a_later_generation_claims_afresh(
    tmp_path: Path,
) -> None:
    start = threading.Barrier(8)
    won: list[bool] = []

    def claim() -> None:
        start.wait(timeout=10)
        won.append(checkpoint.claim(tmp_path, 4, generation=1))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(won) == [False] * 7 + [True]
    assert checkpoint.claim(tmp_path, 4, generation=2)


def test_claims_and_leftovers_of_pruned_steps_go_with_them(tmp_path: Path) -> None:
    tmp_path.joinpath(".step-2.abc.tmp").write_bytes(b"a writer of step 2 died here")
    for step in (2, 4, 6, 8):
        assert checkpoint.claim(tmp_path, step, generation=1)
        checkpoint.save(tmp_path, step, {"step": step})
    assert checkpoint.claim(tmp_path, 10, generation=1)  # its writer died before the file
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        ".step-10.g1.claim",
        ".step-4.g1.claim",
        ".step-6.g1.claim",
        ".step-8.g1.claim",
        "step-4.pt",
        "step-6.pt",
        "step-8.pt",
    ]
    # A rerun under the same generation (a local run) must be able to write step 10.
    checkpoint.drop_unfinished_claims(tmp_path)
    assert checkpoint.claim(tmp_path, 10, generation=1)


def checkpoint_writers(reports: list[dict[str, Any]]) -> dict[int, list[int]]:
    """step -> ranks that reported writing its checkpoint."""
    writers: dict[int, list[int]] = {}
    for m in reports:
        if m["kind"] == "worker_phase" and m["phase"] == "checkpoint":
            writers.setdefault(m["step"], []).append(m["rank"])
    return writers


def test_each_node_writes_one_copy_of_each_checkpoint() -> None:
    spec = make_spec(steps=4, global_batch=12, checkpoint_every=2)
    with agent_and_store() as (agent, rendezvous, scratch):
        # Rank 0 alone on node a; ranks 1 and 2 share node b.
        nodes = {0: scratch / "a", 1: scratch / "b", 2: scratch / "b"}
        launches = [
            make_launch(spec, rendezvous, agent, nodes[rank], rank, world_size=3)
            for rank in range(3)
        ]
        reports = run_ranks(agent, launches)
        listing = {node: sorted(p.name for p in (scratch / node).glob("step-*")) for node in "ab"}
        copies = {node: state_of(scratch / node, 4) for node in "ab"}

    writers = checkpoint_writers(reports)
    assert sorted(writers) == [2, 4]
    for step in (2, 4):
        # Rank 0 wrote node a's copy; exactly one of ranks 1 and 2 wrote node b's.
        first, second = sorted(writers[step])
        assert first == 0 and second in (1, 2)
    assert listing == {"a": ["step-2.pt", "step-4.pt"], "b": ["step-2.pt", "step-4.pt"]}
    assert_same_bits(copies["b"], copies["a"])


def test_a_restart_takes_the_newest_copy_even_when_another_node_holds_it() -> None:
    spec = make_spec(steps=6, checkpoint_every=2)
    with agent_and_store() as (agent, rendezvous, scratch):
        whole = [make_launch(spec, rendezvous, agent, scratch / f"whole-{r}", r, 2) for r in (0, 1)]
        run_ranks(agent, whole)
        expected = state_of(scratch / "whole-0", 6)

        # After a restart rank 0 sits on a node that only has step 2; rank 1's has step 4.
        for node, step in (("c", 2), ("d", 4)):
            (scratch / node).mkdir()
            source = checkpoint.checkpoint_path(scratch / "whole-1", step)
            shutil.copy(source, scratch / node)
        restart = [
            next_generation(make_launch(spec, rendezvous, agent, scratch / n, r, 2), 2)
            for r, n in ((0, "c"), (1, "d"))
        ]
        reports = run_ranks(agent, restart)
        ends = [state_of(scratch / node, 6) for node in "cd"]

    assert resumed_from(reports) == {4}
    for end in ends:
        assert_same_bits(end, expected)
