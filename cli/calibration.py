"""``unicron calibration [--out FILE]``: what the planner has measured so far.

Shows, per transition kind, the factor the planner multiplies its modelled downtime by
(measured / modelled, and how many measured transitions it folds in), per job the observed over
modelled step time, and the failure rate behind D_run. ``--out FILE`` saves the record as JSON
for ``unicron simulate --calibration FILE``, so a simulation of a bigger cluster prices
transitions with the numbers this cluster measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from unicron.cli.common import EXIT_REFUSED, ApiUrl, api, console, fail, json_output, print_json
from unicron.shared.contracts.calibration import CalibrationRecord

from unicron.async_client import DEFAULT_API_URL


def calibration_table(record: CalibrationRecord) -> Table:
    table = Table(title="planner calibration (measured / modelled)")
    for column in ("what", "factor", "samples"):
        table.add_column(column, justify="left" if column == "what" else "right")
    for kind, factor in sorted(record.transition_factors.items()):
        samples = record.transition_samples.get(kind, 0)
        table.add_row(f"transition {kind}", f"{factor:.2g}", str(samples))
    for job, slowdown in sorted(record.job_slowdown.items()):
        table.add_row(f"job {job} step time", f"{slowdown:.2g}", "-")
    rate = record.failure_rate_per_gpu_h
    table.add_row("failures per GPU-hour", "-" if rate is None else f"{rate:.2g}", "-")
    return table


def calibration(
    out: Annotated[
        Path | None, typer.Option(help="Save the record as JSON (unicron simulate --calibration).")
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
) -> None:
    """Show what the planner has calibrated from measured steps, transitions and failures."""
    with api(api_url) as client:
        record = client.calibration()
    if out is not None:
        try:
            out.write_text(record.model_dump_json(indent=2) + "\n")
        except OSError as exc:
            fail(f"cannot write {out}: {exc.strerror}", EXIT_REFUSED)
    if json_output():
        print_json(record)
        return
    console().print(calibration_table(record))
    if out is not None:
        console().print(f"saved to {out}")
