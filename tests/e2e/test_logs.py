"""End-to-end: a rank's output is readable through the API, from the agent of the node that
ran it, while the job runs, after its worker was killed, after a survivor re-formed in place
under a new generation, and after the job finished."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from tests.e2e.conftest import get_job, small_job, wait_for, wait_terminal


@pytest.mark.extended  # the dashboard test reads a rank's output through the same API
def test_rank_output_through_a_recovery_and_after_the_end(api: httpx.Client) -> None:
    job = api.post("/v1/jobs", json=small_job("logs", steps=80, max_workers=2)).json()
    path = f"/v1/jobs/{job['id']}/logs"

    def output(words: str, **params: str | int) -> str | None:
        response = api.get(path, params=params)
        return response.text if response.status_code == 200 and words in response.text else None

    first = wait_for("rank 1's output", lambda: output("training", rank=1))
    assert "rank=1" in first and "generation=1" in first
    # in place needs a generation that stepped
    running = wait_for("a few steps", lambda: (j := get_job(api, job["id"]))["step"] >= 3 and j)
    assert running["state"] == "RUNNING" and running["generation"] == 1

    victim = next(w for w in running["workers"] if w["rank"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    wait_for("generation 2", lambda: get_job(api, job["id"])["generation"] >= 2)
    # rank 0 survived in place: generation 2's rank 0 is the process launched in generation 1
    survivor = wait_for("the survivor's regroup", lambda: output("regrouped", rank=0))
    assert "generation=1" in survivor and "generation=2" in survivor
    # the killed worker's output is still there, on its node, under its generation
    killed = output("training", rank=1, generation=1, tail=10_000)
    assert killed is not None and killed.startswith(first[:200])

    done = wait_terminal(api, job["id"])
    assert done["state"] == "SUCCEEDED", done["history"]
    assert output("training", rank=1, generation=1, tail=10_000) == killed
    assert output("regrouped", rank=0, tail=10_000) is not None  # the last generation's
    assert api.get(path, params={"rank": 2}).status_code == 404
