"""The read-only web dashboard: one static page at ``/ui`` (and ``/ui/jobs/{id}`` for one job).

The page is plain HTML, CSS and JavaScript shipped in the package (``services/api/static``),
with no build step and nothing fetched from elsewhere: clusters often have no internet. It
holds no data of its own: the browser reads the same ``/v1`` GET calls and event stream as the
CLI, with the token the user typed, so the page itself is public and every byte of data behind
it needs a token when the API asks for one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException, status
from fastapi import Path as PathParam
from fastapi.responses import FileResponse

router = APIRouter(prefix="/ui", include_in_schema=False)
STATIC = Path(__file__).resolve().parent.parent / "static"
PAGE = "index.html"
# The page's files by name, with their types; anything else under /ui/assets is a 404, so a
# crafted name can never reach outside the folder.
JAVASCRIPT = "text/javascript; charset=utf-8"  # ES modules: dashboard.js imports the rest
ASSETS = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": JAVASCRIPT,
    "api.js": JAVASCRIPT,
    "chart.js": JAVASCRIPT,
    "dom.js": JAVASCRIPT,
    "feed.js": JAVASCRIPT,
    "pages.js": JAVASCRIPT,
}
# The page runs only its own script and style and talks only to this API: an injected
# <script> or a job name full of markup has nowhere to load from and nothing to run.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
JOB_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"


def _file(name: str, media_type: str) -> FileResponse:
    return FileResponse(STATIC / name, media_type=media_type, headers=HEADERS)


@router.get("")
async def dashboard() -> FileResponse:
    """The cluster: nodes and slots, jobs, the live event feed and the throughput chart."""
    return _file(PAGE, "text/html; charset=utf-8")


@router.get("/jobs/{job_id}")
async def job_page(
    job_id: Annotated[str, PathParam(pattern=JOB_ID, description="the job to show")],
) -> FileResponse:
    """The same page in job mode: it reads the job id from its own address."""
    return _file(PAGE, "text/html; charset=utf-8")


@router.get("/assets/{name}")
async def asset(name: str) -> FileResponse:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"no dashboard asset {name!r}; the page has {', '.join(sorted(ASSETS))}",
        )
    return _file(name, media_type)
