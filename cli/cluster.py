"""Cluster commands: ``nodes`` and ``events``."""

from __future__ import annotations

from typing import Annotated

import typer
from unicron.cli.client import DEFAULT_API_URL, ApiUnreachable
from unicron.cli.common import EXIT_UNAVAILABLE, ApiUrl, api, console, fail
from unicron.cli.render import event_line, nodes_table


def nodes(api_url: ApiUrl = DEFAULT_API_URL) -> None:
    """Show the cluster's nodes, their GPU slots and heartbeats."""
    with api(api_url) as client:
        found = client.nodes()
    out = console()
    out.print(nodes_table(found) if found else "no nodes registered")


def events(
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events as they happen.")
    ] = False,
    since: Annotated[
        int, typer.Option(min=0, help="Start after this event number (the #N shown); 0 = all.")
    ] = 0,
    api_url: ApiUrl = DEFAULT_API_URL,
) -> None:
    """Print the stored event history; with --follow, then every new event until Ctrl-C."""
    out = console()
    last = since
    with api(api_url) as client:
        try:
            for seq, event in client.events(since=since, follow=follow):
                # soft_wrap: one event per line whatever the width, so it greps well
                out.print(event_line(seq, event), soft_wrap=True)
                last = seq
        except KeyboardInterrupt:
            return
        except ApiUnreachable as exc:
            if last == since:  # nothing came through: the plain "cannot reach" message
                raise
            fail(
                f"the event stream broke after #{last}: {exc}; resume with --since {last}",
                EXIT_UNAVAILABLE,
            )
    if follow:  # a followed stream only ends when the server goes away
        fail(
            f"the API closed the event stream after #{last}; resume with --since {last}",
            EXIT_UNAVAILABLE,
        )
