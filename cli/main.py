"""The ``unicron`` console script: registers every command on one typer app."""

from __future__ import annotations

import typer

from cli.calibration import calibration
from cli.cluster import events, nodes
from cli.common import global_options
from cli.demo import demo
from cli.faults import fault
from cli.jobs import cancel, status, submit
from cli.plan import plan
from cli.simulate import simulate
from cli.stack import up

app = typer.Typer(
    name="unicron",
    help="Unicron: a self-healing workload manager for LLM training clusters.",
    epilog="Exit codes: 0 done; 1 a followed job did not succeed; 2 refused (bad input, "
    "unknown job, conflict); 3 the API is unreachable or failing.",
    no_args_is_help=True,
    add_completion=False,
)

app.callback()(global_options)
app.command()(up)
app.command()(demo)
app.command()(submit)
app.command()(status)
app.command()(cancel)
app.command()(nodes)
app.command()(events)
app.command()(fault)
app.command()(plan)
app.command()(calibration)
app.command()(simulate)


if __name__ == "__main__":
    app()
