"""The ``unicron`` console script: registers every command on one typer app."""

from __future__ import annotations

import typer
from unicron.cli.calibration import calibration
from unicron.cli.cluster import events, nodes
from unicron.cli.common import global_options
from unicron.cli.demo import demo
from unicron.cli.faults import fault
from unicron.cli.jobs import cancel, status, submit
from unicron.cli.logs import logs
from unicron.cli.plan import plan
from unicron.cli.simulate import simulate
from unicron.cli.up import up

app = typer.Typer(
    name="unicron",
    help="Unicron: a self-healing workload manager for LLM training clusters.",
    epilog="Exit codes: 0 done; 1 a followed job did not succeed; 2 refused (bad input, "
    "unknown job, conflict); 3 the API is unreachable or failing.",
    no_args_is_help=True,
    add_completion=False,
)

app.callback()(global_options)
COMMANDS = (
    up,
    demo,
    submit,
    status,
    cancel,
    nodes,
    events,
    fault,
    logs,
    plan,
    calibration,
    simulate,
)
for command in COMMANDS:  # in the order `unicron --help` lists them
    app.command()(command)


if __name__ == "__main__":
    app()
