"""What every client command shares: the ``--api`` option, the global ``--token`` and
``--output``, consoles, JSON output, errors → exit codes.

Exit codes: 0 success; 1 a followed job ended without succeeding; 2 the request was refused
(bad input, unknown job, conflict: fix the command); 3 the API is unreachable or failed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from enum import Enum
from typing import Annotated, Any, NoReturn

import typer
from pydantic_core import to_jsonable_python
from rich.console import Console

from unicron.client import Client
from unicron.errors import ApiError, ApiUnreachable

EXIT_JOB_UNSUCCESSFUL = 1
EXIT_REFUSED = 2
EXIT_UNAVAILABLE = 3

# Where the global --token waits for the subcommand, so ``api()`` finds it without each
# command declaring the option. A context variable, not a global: tests run several
# invocations in threads of one process.
_token: ContextVar[str | None] = ContextVar("unicron_api_token", default=None)


class OutputFormat(str, Enum):
    TEXT = "text"
    JSON = "json"


_output: ContextVar[OutputFormat] = ContextVar("unicron_output", default=OutputFormat.TEXT)

ApiUrl = Annotated[
    str,
    typer.Option("--api", envvar="UNICRON_API_URL", help="Base URL of the Unicron REST API."),
]
ApiToken = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="UNICRON_API_TOKEN",
        help="Bearer token for an API that has tokens configured.",
        show_default=False,  # never print a secret in --help
    ),
]
Output = Annotated[
    OutputFormat,
    typer.Option(
        "--output",
        "-o",
        envvar="UNICRON_OUTPUT",
        case_sensitive=False,
        help="How client commands print what they got: tables for people, or JSON for "
        "programs (one document; `events` and `logs` one per line).",
    ),
]


def console() -> Console:
    # Built per command, so it writes to whatever stdout is current (CliRunner swaps it).
    return Console(highlight=False)


def fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def global_options(token: ApiToken = None, output: Output = OutputFormat.TEXT) -> None:
    """Options given before the command, for every client command; an empty token (say, an
    exported but blank UNICRON_API_TOKEN) means none."""
    if token and (not (token.isascii() and token.isprintable()) or " " in token):
        fail("--token must be printable ASCII without spaces", EXIT_REFUSED)
    # always set: the previous invocation's options must not linger
    _token.set(token or None)
    _output.set(output)


def json_output() -> bool:
    return _output.get() == OutputFormat.JSON


def print_json(value: Any, lines: bool = False) -> None:
    """``value`` (models, lists and dicts of them) as JSON on stdout: indented, or on one line
    for a stream read a line at a time (``lines``)."""
    sys.stdout.write(json.dumps(to_jsonable_python(value), indent=None if lines else 2) + "\n")
    sys.stdout.flush()


@contextmanager
def api(url: str, token: str | None = None) -> Iterator[Client]:
    """A client whose failures end the command with a message and the matching exit code;
    it sends ``token``, or else the global --token."""
    try:
        with Client(url, token=token or _token.get()) as client:
            yield client
    except ApiUnreachable as exc:
        hint = "is it running? start it with `unicron up`, or pass --api URL"
        fail(f"{exc}\n({hint})", EXIT_UNAVAILABLE)
    except ApiError as exc:
        fail(exc.message, EXIT_REFUSED if exc.status_code < 500 else EXIT_UNAVAILABLE)
