"""One job across three hosts, through a crash, a cut link and the link's return (issue 13).

A control-plane host and three node hosts on a private network (tests/multihost/netns.py), each
agent with its own data directory. The test runs one 3-rank job and, in order:

1. the job trains on all three hosts;
2. SIGKILL of the rank on host n2 is recovered in place, across hosts;
3. cutting n2's link is detected as node loss; the job shrinks to n1 and n3 with its state taken
   over the network, and n2's old workers stop by themselves (fenced);
4. restoring the link brings n2 back READY and the job grows back to three;
5. at no time did two generations both complete steps: no generation completed a step after a
   newer one had (``fenced_stale_steps``, from every host's step ledger).

It prints, last, one JSON line with the figures. Run it with ``make test-multihost``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from unicron.trainer.ledger import LEDGER_FILE, LedgerEntry, read_ledger

from tests.multihost.cluster import NODES, Cluster, record_figures, wait_for

pytestmark = pytest.mark.multihost

JOB = {
    "name": "multihost",
    "steps": 1_000_000,  # runs until the test cancels it
    "global_batch": 12,  # the planner's model prefers 3 ranks to 2 for this job
    "micro_batch": 2,
    "min_workers": 2,
    "max_workers": 3,
    "checkpoint_every": 50,
    "model": {"n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 32, "vocab": 64},
}


class Run:
    """The job under test, seen through the API."""

    def __init__(self, cluster: Cluster, api: httpx.Client, job_id: str) -> None:
        self.cluster, self.api, self.id = cluster, api, job_id
        self.figures: dict[str, float] = {}

    def job(self) -> dict[str, Any]:
        return self.cluster.job(self.api, self.id)

    def stepping(self, what: str, timeout_s: float, **want: Callable[[Any], bool]) -> Any:
        """The job record once it steps in a generation matching ``want`` (a test per key)."""

        def probe() -> Any:
            job = self.job()
            ok = job["state"] == "RUNNING" and job["stepping"]
            return job if ok and all(test(job[key]) for key, test in want.items()) else None

        return wait_for(what, probe, timeout_s)

    def in_place_after(
        self, generation: int, what: str, timeout_s: float, **want: Callable[[Any], bool]
    ) -> dict[str, Any]:
        job: dict[str, Any] = self.stepping(what, timeout_s, generation=generation.__lt__, **want)
        assert job["transition_kind"] == "in_place" and job["transition_fallback"] is None
        return job


def node_of(job: dict[str, Any], node: str) -> dict[str, Any]:
    return next(w for w in job["workers"] if w["node_id"] == node)


def hosts_of(job: dict[str, Any]) -> set[str]:
    return {w["node_id"] for w in job["workers"]}


def crash_a_rank(run: Run, node: str) -> dict[str, Any]:
    """SIGKILL the rank on ``node``: recovered in place, across hosts."""
    job = run.job()
    start = time.monotonic()
    fault = {"rank": node_of(job, node)["rank"], "kind": "crash"}
    assert run.api.post(f"/v1/jobs/{run.id}/faults", json=fault).status_code == 202
    job = run.in_place_after(job["generation"], "recovery from the crash", 60)
    run.figures["crash_recover_s"] = time.monotonic() - start
    assert hosts_of(job) == set(NODES)
    return job


def cut_a_link(run: Run, node: str) -> dict[str, Any]:
    """Node loss, a shrink to the other hosts, and ``node``'s old workers fenced."""
    job = run.job()
    old_pids = {node_of(job, node)["pid"]}
    start = time.monotonic()
    run.cluster.net.cut(node)
    wait_for(f"{node} LOST", lambda: run.cluster.node_state(run.api, node) == "LOST", 30)
    run.figures["node_loss_detect_s"] = time.monotonic() - start
    job = run.in_place_after(job["generation"], "the shrink", 90, world_size=(2).__eq__)
    run.figures["shrink_s"] = time.monotonic() - start
    assert hosts_of(job) == set(NODES) - {node}
    wait_for(f"{node}'s old workers gone", lambda: not old_pids & run.cluster.net.pids(node), 60)
    return job


def restore_the_link(run: Run, node: str) -> dict[str, Any]:
    """``node`` READY again, and the job grown back onto it."""
    job = run.job()
    start = time.monotonic()
    run.cluster.net.restore(node)
    wait_for(f"{node} READY", lambda: run.cluster.node_state(run.api, node) == "READY", 60)
    job = run.in_place_after(job["generation"], "the grow", 120, world_size=(3).__eq__)
    run.figures["grow_back_s"] = time.monotonic() - start
    assert hosts_of(job) == set(NODES)
    return job


def stale_steps(entries: list[LedgerEntry]) -> int:
    """Steps a generation completed at or after a step a newer generation had completed."""
    first_of: dict[int, int] = {}
    for entry in entries:
        first_of[entry.generation] = min(first_of.get(entry.generation, entry.step), entry.step)
    return sum(
        any(newer > e.generation and first <= e.step for newer, first in first_of.items())
        for e in entries
    )


def ledgers(data: Path) -> list[LedgerEntry]:
    return [e for path in data.rglob(LEDGER_FILE) for e in read_ledger(path.parent)]


def test_a_job_survives_a_crash_a_cut_link_and_grows_back(cluster: Cluster) -> None:
    with cluster.api() as api:
        wait_for("three READY nodes", lambda: cluster.ready_nodes(api) == set(NODES), 90)
        response = api.post("/v1/jobs", json=JOB)
        assert response.status_code == 201, response.text
        run = Run(cluster, api, response.json()["id"])
        job = run.stepping("3 ranks stepping", 180, world_size=(3).__eq__)
        assert hosts_of(job) == set(NODES)
        crash_a_rank(run, "n2")
        cut_a_link(run, "n2")
        restore_the_link(run, "n2")
        assert api.post(f"/v1/jobs/{run.id}/cancel").status_code == 200

    # no split brain: every step once, never by a generation after a newer one stepped
    entries = ledgers(cluster.data)
    steps = sorted(e.step for e in entries)
    assert steps == list(range(1, len(steps) + 1)), "a step is missing or was completed twice"
    run.figures["fenced_stale_steps"] = stale_steps(entries)
    assert run.figures["fenced_stale_steps"] == 0
    record_figures(run.figures)
