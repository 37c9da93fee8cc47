"""Cluster commands: ``nodes`` and ``events`` (JSON with ``unicron --output json``: the nodes as
one list, the events one ``{"seq": N, "event": CloudEvent}`` object per line)."""

from __future__ import annotations

from typing import Annotated

import typer
from unicron.cli.common import (
    EXIT_UNAVAILABLE,
    ApiUrl,
    api,
    console,
    fail,
    json_output,
    print_json,
)
from unicron.cli.render import event_line, nodes_table

from unicron.async_client import DEFAULT_API_URL
from unicron.errors import ApiUnreachable


def nodes(api_url: ApiUrl = DEFAULT_API_URL) -> None:
    """Show the cluster's nodes, their GPU slots and heartbeats."""
    with api(api_url) as client:
        found = client.nodes()
    if json_output():
        print_json(found)
        return
    console().print(nodes_table(found) if found else "no nodes registered")


def events(
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events as they happen.")
    ] = False,
    since: Annotated[
        int, typer.Option(min=0, help="Start after this event number (the #N shown); 0 = all.")
    ] = 0,
    event_types: Annotated[
        list[str] | None,
        typer.Option("--type", help="Only events of this type (repeat it), e.g. failure.detected."),
    ] = None,
    job: Annotated[
        str | None, typer.Option("--job", help="Only the events about this job.")
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
) -> None:
    """Print the stored event history; with --follow, then every new event until Ctrl-C (a
    dropped connection is resumed where it broke). --type and --job filter on the server."""
    out = console()
    last = since
    with api(api_url) as client:
        try:
            wanted = client.sequenced_events(event_types or (), job, since=since, follow=follow)
            for seq, event in wanted:
                if json_output():
                    print_json({"seq": seq, "event": event}, lines=True)
                else:  # soft_wrap: one event per line whatever the width, so it greps well
                    out.print(event_line(seq, event), soft_wrap=True)
                last = seq
        except KeyboardInterrupt:
            return
        except ApiUnreachable as exc:
            if last == since:  # nothing came through: the plain "cannot reach" message
                raise
            fail(f"{exc}; resume with --since {last}", EXIT_UNAVAILABLE)
