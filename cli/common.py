"""What every client command shares: the ``--api`` option, consoles, errors → exit codes.

Exit codes: 0 success; 1 a followed job ended without succeeding; 2 the request was refused
(bad input, unknown job, conflict: fix the command); 3 the API is unreachable or failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from cli.client import ApiClient, ApiError, ApiUnreachable

EXIT_JOB_UNSUCCESSFUL = 1
EXIT_REFUSED = 2
EXIT_UNAVAILABLE = 3

ApiUrl = Annotated[
    str,
    typer.Option("--api", envvar="UNICRON_API_URL", help="Base URL of the Unicron REST API."),
]


def console() -> Console:
    # Built per command, so it writes to whatever stdout is current (CliRunner swaps it).
    return Console(highlight=False)


def fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def api(url: str) -> Iterator[ApiClient]:
    """A client whose failures end the command with a message and the matching exit code."""
    try:
        with ApiClient(url) as client:
            yield client
    except ApiUnreachable as exc:
        hint = "is it running? start it with `unicron up`, or pass --api URL"
        fail(f"{exc}\n({hint})", EXIT_UNAVAILABLE)
    except ApiError as exc:
        fail(exc.message, EXIT_REFUSED if exc.status_code < 500 else EXIT_UNAVAILABLE)
