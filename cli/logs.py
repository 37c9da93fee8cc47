"""``unicron logs``: print one rank's output (stdout and stderr) as the API serves it.

The text is written as it arrives, so ``--follow`` shows new lines while the worker runs and
returns once it has exited and everything is printed (Ctrl-C stops it earlier). With
``unicron --output json`` each line is a JSON object of its own (job, rank, generation, line).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Annotated

import typer
from unicron.cli.common import ApiUrl, api, json_output, print_json
from unicron.shared.contracts.logs import MAX_TAIL_LINES

from unicron.async_client import DEFAULT_API_URL


def whole_lines(chunks: Iterable[str]) -> Iterator[str]:
    """The lines of a text that arrives in chunks cut anywhere; the last one even unended."""
    rest = ""
    for chunk in chunks:
        *lines, rest = (rest + chunk).split("\n")
        yield from lines
    if rest:
        yield rest


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
    with api(api_url) as client:
        chunks = client.logs(job_id, rank, generation, tail, follow)
        try:
            if json_output():
                where = {"job_id": job_id, "rank": rank, "generation": generation}
                for line in whole_lines(chunks):
                    print_json(where | {"line": line}, lines=True)
                return
            for text in chunks:
                sys.stdout.write(text)
                sys.stdout.flush()
        except KeyboardInterrupt:
            raise typer.Exit(0) from None
