"""The dashboard in a real browser (Debian's chromium, driven by Playwright) over a real stack
whose API asks for tokens: the page asks for one, shows a running job on the node grid, shows a
killed worker as a failure in its live feed and the job back to RUNNING; a job's page shows its
plan and its workers' output. Every request the page makes is a GET with the token in a header.
The cluster view after the recovery is saved as a screenshot (its path is printed)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from unicron.cli.stack import Stack
from unicron.shared.contracts.models import NodeRecord
from unicron.shared.store.state import StateStore

from tests.api.factories import ADMIN, TOKENS, bearer
from tests.e2e.conftest import small_job
from tests.stacks import stack_on_own_servers
from tests.waiting import wait_for

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(
        f"Debian's chromium is not at {CHROMIUM} (apt-get install chromium)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')"
)

pytestmark = pytest.mark.timeout(180)
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
ARTIFACTS = Path(__file__).resolve().parents[2] / ".unicron" / "artifacts"
WAIT_MS = 60_000
WORLD = 2  # the job fills both slots
expect = sync_api.expect
expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tokens = {"UNICRON_API_TOKENS": json.dumps(TOKENS)}
    root = tmp_path_factory.mktemp("dashboard")
    # a job on two ranks: half the torch processes of 2 x 2, for the same story
    with stack_on_own_servers(root, nodes=2, slots=1, extra_env=tokens) as running:
        yield running


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.api_url, headers=bearer(ADMIN), timeout=10) as client:
        yield client


def _job(api: httpx.Client, job_id: str) -> dict[str, Any]:
    return dict(api.get(f"/v1/jobs/{job_id}").raise_for_status().json())


def _running(api: httpx.Client, job_id: str, step: int) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        job = _job(api, job_id)
        live = [w for w in job["workers"] if w["state"] == "RUNNING" and w["pid"]]
        ready = job["state"] == "RUNNING" and len(live) == WORLD and job["step"] >= step
        return job if ready else None

    return dict(wait_for(f"{job_id} running on {WORLD} workers past step {step}", probe, 90))


@pytest.fixture(scope="module")
def job_id(api: httpx.Client) -> str:
    """One long job on every slot; the stack stops it at the end of the module."""
    response = api.post("/v1/jobs", json=small_job("dashboard", steps=100_000))
    return str(response.raise_for_status().json()["id"])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class Tab:
    """A browser page and every request it made, in order."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.requests: list[Any] = []
        page.on("request", lambda request: self.requests.append(request))

    def log_in(self, token: str) -> int:
        """Answer the token dialog; the number of requests made before."""
        expect(self.page.locator("#login")).to_be_visible()
        self.page.fill("#token", token)
        before = len(self.requests)
        self.page.click("#login button[type=submit]")
        return before

    def check_reads(self, since: int) -> None:
        """Every request was a GET, no token was in an address, and from ``since`` on each
        API call carried the admin token in its Authorization header."""
        assert {r.method for r in self.requests} == {"GET"}
        assert not [r.url for r in self.requests if ADMIN in r.url]
        reads = [r for r in self.requests[since:] if "/v1/" in r.url]
        assert reads, "the page read nothing from the API after the log-in"
        for request in reads:
            assert request.all_headers().get("authorization") == f"Bearer {ADMIN}", request.url


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1400, "height": 820})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    yield Tab(page)
    context.close()


def test_a_killed_worker_shows_in_the_live_feed_and_the_job_goes_back_to_running(
    tab: Tab, stack: Stack, api: httpx.Client, job_id: str
) -> None:
    page = tab.page
    page.goto(f"{stack.api_url}/ui")
    logged_in = tab.log_in(ADMIN)
    row = page.locator(f'#jobs tr[data-job="{job_id}"]')
    expect(row).to_have_attribute("data-state", "RUNNING")
    expect(page.locator("#nodes .cell.RUNNING")).to_have_count(WORLD)
    expect(page.locator("#live")).to_have_class(re.compile(r"\bon\b"))

    job = _running(api, job_id, step=5)
    os.kill(next(w["pid"] for w in job["workers"] if w["rank"] == 1), signal.SIGKILL)

    failure = page.locator('#feed li[data-type="failure.detected"]', has_text=job_id)
    expect(failure).to_contain_text("crash")
    expect(failure).to_contain_text("rank 1")
    back = page.locator(f'#jobs tr[data-job="{job_id}"][data-recoveries="1"]')
    expect(back).to_have_attribute("data-state", "RUNNING")
    expect(back).to_contain_text("crash")  # its last failure
    expect(page.locator("#nodes .cell.RUNNING")).to_have_count(WORLD)
    expect(page.locator("#chart-steps polyline")).to_have_count(1)

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"dashboard screenshot: {shot}")
    tab.check_reads(since=logged_in)


def test_a_job_page_asks_again_for_a_bad_token_and_shows_the_plan_and_output(
    tab: Tab, stack: Stack, api: httpx.Client, job_id: str
) -> None:
    page = tab.page
    page.goto(f"{stack.api_url}/ui/jobs/{job_id}")
    tab.log_in("not-the-token-0123456789")
    expect(page.locator("#login-why")).to_contain_text("not valid")
    logged_in = tab.log_in(ADMIN)
    expect(page.locator("#job-name")).to_contain_text("RUNNING")
    expect(page.locator("#workers tbody tr")).to_have_count(WORLD)
    expect(page.locator("#plan-id")).to_contain_text("plan-")
    expect(page.locator("#plan")).to_contain_text(f"→ {WORLD} workers")  # its allocation, explained
    expect(page.locator("#plan")).to_contain_text("predicted WAF")
    expect(page.locator("#logs")).to_contain_text("training")
    tab.check_reads(since=logged_in)


def test_a_gpu_retired_after_a_fault_shows_on_its_node_with_the_fault(
    tab: Tab, stack: Stack
) -> None:
    """As its agent's heartbeat records it (``NodeRecord.retired_gpus``); a node of no agent
    here, with no slot, so that no plan places work on it."""
    why = "Xid 79: the GPU has fallen off the bus"
    record = NodeRecord(id="gpu-x", slots=0, gpus=1, retired_gpus={"0": why}, boot_id="gpu-x")
    with ThreadPoolExecutor(1) as thread:  # Playwright's sync API holds this thread's loop
        thread.submit(asyncio.run, _put_node(stack.redis_url, record)).result(timeout=30)
    page = tab.page
    page.goto(f"{stack.api_url}/ui")
    tab.log_in(ADMIN)
    cell = page.locator('#nodes [data-node="gpu-x"] .cell.retired')
    expect(cell).to_have_text("GPU 0 retired")
    expect(cell).to_have_attribute("title", f"GPU 0 retired: {why}")


async def _put_node(redis_url: str, record: NodeRecord) -> None:
    state = await StateStore.connect(redis_url)
    try:
        await state.put_node(record)
    finally:
        await state.close()
