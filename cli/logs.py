"""``unicron logs``: print one rank's output (stdout and stderr) as the API serves it.

The text is written as it arrives, so ``--follow`` shows new lines while the worker runs and
returns once it has exited and everything is printed (Ctrl-C stops it earlier).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import httpx
import typer
from unicron.cli.client import DEFAULT_API_URL, ApiClient, ApiError, ApiUnreachable, error_message
from unicron.cli.common import ApiUrl, api
from unicron.shared.contracts.logs import MAX_TAIL_LINES

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0  # without --follow the server sends the whole text at once


def print_logs(client: ApiClient, job_id: str, params: dict[str, Any], follow: bool) -> None:
    # a followed worker may print nothing for a long time: no read timeout then
    timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=None if follow else READ_TIMEOUT_S)
    path = f"/v1/jobs/{job_id}/logs"
    try:
        with client.http.stream("GET", path, params=params, timeout=timeout) as response:
            if response.is_error:
                response.read()
                raise ApiError(response.status_code, error_message(response))
            for text in response.iter_text():
                sys.stdout.write(text)
                sys.stdout.flush()
    except httpx.TransportError as exc:
        raise ApiUnreachable(f"cannot reach the Unicron API at {client.base_url}: {exc}") from exc


def logs(
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="The job's id.")],
    rank: Annotated[int, typer.Option(min=0, help="Whose output.")] = 0,
    generation: Annotated[
        int | None,
        typer.Option(
            min=0, help="Which generation (default: the job's latest).", show_default=False
        ),
    ] = None,
    tail: Annotated[
        int, typer.Option(min=0, max=MAX_TAIL_LINES, help="Start at the last N lines.")
    ] = 100,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new output until the worker ends.")
    ] = False,
    api_url: ApiUrl = DEFAULT_API_URL,
) -> None:
    """Print a rank's output; with --follow, keep printing as it is written."""
    params: dict[str, Any] = {"rank": rank, "tail": tail, "follow": str(follow).lower()}
    if generation is not None:
        params["generation"] = generation
    with api(api_url) as client:
        try:
            print_logs(client, job_id, params, follow)
        except KeyboardInterrupt:
            raise typer.Exit(0) from None
