"""The dashboard's files without a browser: /ui is public, the /v1 data it reads is not, bad
addresses get a clear 4xx, and the files the route serves are in the wheel's package data."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import httpx
from unicron.services.api.routes import ui

from tests.api.factories import TOKENS, USER_A, bearer
from tests.api.live import serve_api

ROOT = Path(__file__).resolve().parents[2]
# What dashboard.js reads: every one must refuse a caller without a token.
PAGE_READS = (
    "/v1/nodes",
    "/v1/jobs?limit=500",
    "/v1/plans/latest",
    "/v1/jobs/job-x",
    "/v1/jobs/job-x/logs?tail=200&rank=0",
    "/v1/plans/plan-x",
    "/v1/events",
)


async def _status(client: httpx.AsyncClient, path: str, headers: dict[str, str]) -> int:
    # streamed: /v1/events never ends, its status is all that is asked
    async with client.stream("GET", path, headers=headers) as response:
        return response.status_code


async def test_the_page_is_public_and_every_call_it_makes_needs_a_token(
    nats_url: str, redis_url: str
) -> None:
    with serve_api(nats_url, redis_url, api_tokens=TOKENS) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
            for path in ("/ui", "/ui/jobs/job-x"):
                page = await client.get(path)
                assert page.status_code == 200, (path, page.text)
                assert page.headers["content-type"].startswith("text/html")
                assert "connect-src 'self'" in page.headers["content-security-policy"]
            linked = re.findall(r'(?:src|href)="/ui/assets/([^"]+)"', page.text)
            assert sorted(linked) == ["dashboard.css", "dashboard.js"]
            for name in (*linked, *ui.ASSETS):
                served = await client.get(f"/ui/assets/{name}")
                assert served.status_code == 200 and served.text, name
                # the modules dashboard.js imports are served too, under the same folder
                imported = re.findall(r'from "\./([^"]+)"', served.text)
                assert set(imported) <= set(ui.ASSETS), (name, imported)
            for path in PAGE_READS:
                assert await _status(client, path, {}) == 401, path
                assert await _status(client, path, bearer(USER_A)) in (200, 404), path


async def test_an_unknown_asset_or_a_malformed_job_id_is_a_4xx_that_says_why(
    nats_url: str, redis_url: str
) -> None:
    with serve_api(nats_url, redis_url) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
            missing = await client.get("/ui/assets/app.py")
            assert missing.status_code == 404
            assert "no dashboard asset 'app.py'" in missing.json()["detail"]
            malformed = await client.get("/ui/jobs/-not an id")
            assert malformed.status_code == 422
            assert "job_id" in malformed.json()["message"]


def test_every_file_the_dashboard_serves_is_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["unicron.services.api"]
    api = ROOT / "services" / "api"
    assert sorted(p.name for p in ui.STATIC.iterdir()) == sorted((ui.PAGE, *ui.ASSETS))
    for name in (ui.PAGE, *ui.ASSETS):
        path = ui.STATIC / name
        assert path.is_file(), path
        relative = path.relative_to(api).as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} is not shipped"
