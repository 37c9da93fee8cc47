"""``unicron up``: the whole stack (:class:`unicron.cli.stack.Stack`) in the foreground until
Ctrl-C."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from unicron.cli.gpushare import GpuShareError
from unicron.cli.stack import Stack, StackConfig
from unicron.shared.servers.credentials import CREDENTIALS_FILE


def _print_endpoints(console: Console, stack: Stack) -> None:
    table = Table(title="Unicron is up", show_header=False)
    table.add_row("API", stack.api_url)
    table.add_row("NATS", stack.nats_url.replace(",", "\n"))
    if stack.redis_ha is not None:
        table.add_row("Redis Sentinels", stack.redis_ha.sentinels_setting.replace(",", "\n"))
    else:
        table.add_row("Redis", stack.redis_url)
    slots = [env["UNICRON_SLOTS"] for env in stack.gpus.envs]
    table.add_row("nodes", f"{stack.config.nodes}, slots {' + '.join(slots)}")
    if stack.gpus.note:
        table.add_row("GPUs", stack.gpus.note)
    table.add_row("logs", str(stack.data_dir / "logs"))
    table.add_row("metrics", "\n".join(f"{n}: {u}" for n, u in stack.metrics_urls.items()))
    if stack.logins is not None:
        table.add_row("credentials", str(stack.data_dir / "secrets" / CREDENTIALS_FILE))
    console.print(table)
    console.print("Ctrl-C stops everything.")


def up(
    nodes: Annotated[int, typer.Option(min=1, help="node agents to start")] = 2,
    slots: Annotated[
        int | None,
        typer.Option(min=1, help="worker slots per node [default: 2; one per GPU on a GPU host]"),
    ] = None,
    nats_url: Annotated[
        str | None, typer.Option(help="use this NATS instead of starting one")
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option(help="use this Redis instead of starting one")
    ] = None,
    api_port: Annotated[int, typer.Option(envvar="UNICRON_API_PORT")] = 8080,
    data_dir: Annotated[Path, typer.Option(envvar="UNICRON_DATA_DIR")] = Path(".unicron"),
    ha: Annotated[
        bool,
        typer.Option(
            "--ha",
            help="3 clustered NATS servers and a Redis primary, replica and 3 Sentinels: "
            "the control plane survives losing any one server",
        ),
    ] = False,
) -> None:
    """Run the whole stack in the foreground."""
    console = Console()
    config = StackConfig(nodes, slots, nats_url, redis_url, api_port, data_dir, ha=ha)
    stack = Stack(config)
    try:
        stack.start()
        _print_endpoints(console, stack)
        stack.supervise(threading.Event())  # until Ctrl-C; each restart logs its own line
    except KeyboardInterrupt:
        console.print("stopping…")
    except GpuShareError as exc:  # nothing started: a setting to change, not a failure
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    except (TimeoutError, RuntimeError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from exc
    finally:
        stack.stop()
