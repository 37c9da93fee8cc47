"""``unicron up``'s supervision brings its own Redis back after a kill -9, with the data."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
from unicron.cli.stack import Stack, StackConfig
from unicron.shared.procs import free_port

from tests.e2e.conftest import get_job, small_job, wait_for, wait_terminal


def test_a_killed_embedded_redis_comes_back_with_the_jobs(tmp_path: Path) -> None:
    config = StackConfig(nodes=1, slots=2, api_port=free_port(), data_dir=tmp_path / "stack")
    stop = threading.Event()
    with Stack(config) as stack, httpx.Client(base_url=stack.api_url, timeout=10) as api:
        supervisor = threading.Thread(target=stack.supervise, args=(stop, 0.1), daemon=True)
        supervisor.start()
        try:
            job = api.post("/v1/jobs", json=small_job("survivor", steps=30, max_workers=2))
            job_id = job.json()["id"]
            wait_for("job running", lambda: get_job(api, job_id)["step"] >= 3, 60)
            redis = next(s for s in stack.servers if s.name == "redis-server")
            old_pid = redis.process.pid
            redis.process.kill()
            wait_for("redis restarted", lambda: stack.backoff.restarts.get(redis.name), 15)
            assert redis.process.pid != old_pid
            ready = lambda: api.get("/readyz").status_code == 200  # noqa: E731
            wait_for("api ready again", ready, 20)
            assert get_job(api, job_id)["name"] == "survivor"  # from the append-only file
            assert wait_terminal(api, job_id, 90)["state"] == "SUCCEEDED"
        finally:
            stop.set()
            supervisor.join(timeout=5)
