"""``unicron fault``: inject a fault into one rank of a running job (admin only).

For drills, demos and tests: the API sends it to the rank's agent, the worker fires it, and
the detector reports the failure it causes like any other (watch ``unicron events -f``).
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text
from unicron.cli.common import ApiUrl, api, console, json_output, print_json
from unicron.shared.contracts.messages import FaultAccepted, FaultKind

from unicron.async_client import DEFAULT_API_URL


def describe(accepted: FaultAccepted) -> Text:
    when = f"step {accepted.at_step}" if accepted.at_step else "the next step"
    return Text(
        f"injected {accepted.kind.value} into rank {accepted.rank} of {accepted.job_id} "
        f"(generation {accepted.generation}, node {accepted.node_id}) at {when}\n"
        f"fault id {accepted.fault_id}; watch what it causes: unicron events --follow"
    )


def fault(
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="A running job's id.")],
    rank: Annotated[int, typer.Option(help="The rank to hit.", show_default=False)],
    kind: Annotated[FaultKind, typer.Option(help="What happens to it.", show_default=False)],
    message: Annotated[
        str | None, typer.Option(help="Text of the raised exception (kind exception).")
    ] = None,
    exit_code: Annotated[int | None, typer.Option(help="Exit status 1-255 (kind exit).")] = None,
    slowdown: Annotated[
        float | None, typer.Option(help="Compute-time factor above 1 (kind slow).")
    ] = None,
    at_step: Annotated[
        int | None, typer.Option(help="Fire at this step (default: the next one).")
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
) -> None:
    """Inject a fault into one rank of a running job (needs an admin token when tokens are on)."""
    options = {"message": message, "exit_code": exit_code, "slowdown": slowdown, "at_step": at_step}
    # Only what was given: the server refuses an option that does not fit the kind.
    spec = {"rank": rank, "kind": kind.value} | {k: v for k, v in options.items() if v is not None}
    with api(api_url) as client:
        accepted = client.inject_fault(job_id, spec)
    if json_output():
        print_json(accepted)
    else:
        console().print(describe(accepted))
