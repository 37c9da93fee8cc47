"""How the CLI shows jobs, nodes and events: rich tables and one-line event summaries.

User-supplied text (reasons, names) is passed as ``Text`` so rich never reads it as markup.
"""

from __future__ import annotations

import shlex
import time
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Column, Table
from rich.text import Text
from unicron.shared.contracts.events import CloudEvent
from unicron.shared.contracts.models import (
    FailureRecord,
    HistoryEntry,
    Job,
    JobState,
    JobSummary,
    NodeRecord,
    NodeState,
)

STATE_STYLES = {
    JobState.PENDING: "yellow",
    JobState.STARTING: "cyan",
    JobState.RUNNING: "green",
    JobState.RECOVERING: "magenta",
    JobState.SUCCEEDED: "bold green",
    JobState.FAILED: "bold red",
    JobState.CANCELLED: "dim",
    NodeState.READY: "green",
    NodeState.LOST: "bold red",
    NodeState.QUARANTINED: "magenta",
    NodeState.DRAINED: "dim",
}


def state_text(state: JobState | NodeState) -> Text:
    return Text(state.value, style=STATE_STYLES.get(state, ""))


def clock(at: float, now: float | None = None) -> str:
    """A time of day in the local zone, with the date when it is not the day of ``now``: a
    job that waits since yesterday 23:00 must not read as waiting since a time still to come."""
    when = datetime.fromtimestamp(at)
    today = datetime.fromtimestamp(time.time() if now is None else now).date()
    return when.strftime("%H:%M:%S" if when.date() == today else "%Y-%m-%d %H:%M:%S")


def ago(at: float, now: float | None = None) -> str:
    seconds = max(0.0, (now or time.time()) - at)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{seconds:.0f}s ago"


def _table(*headers: str, shrink: str = "", title: str | None = None) -> Table:
    """A light table where only the column ``shrink`` gives way when the terminal is narrow:
    ids and states stay whole, so they can be read and copied."""
    columns = [Column(h, no_wrap=h != shrink, overflow="ellipsis") for h in headers]
    return Table(*columns, title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)


def jobs_table(jobs: list[JobSummary]) -> Table:
    table = _table("ID", "NAME", "STATE", "STEP", "WORKERS", "RECOVERIES", "AGE", shrink="NAME")
    for job in jobs:
        table.add_row(
            job.id,
            Text(job.name),
            state_text(job.state),
            f"{job.step}/{job.spec.steps}",
            str(job.world_size),
            str(job.recoveries),
            ago(job.submitted_at),
        )
    return table


def history_line(entry: HistoryEntry) -> Text:
    return Text.assemble(clock(entry.at), "  ", state_text(entry.state), "  ", entry.reason)


def failure_text(failure: FailureRecord) -> Text:
    """``kind: category (severity, action) on rank R @ node``, then the exception's text."""
    where = f" on rank {failure.rank}" if failure.rank is not None else ""
    where += f" @ {failure.node_id}" if failure.node_id else ""
    what = f"{failure.kind.value}: {failure.category.value}"
    head = f"{what} ({failure.severity.value}, {failure.action.value}){where}"
    text = Text(head)
    if failure.exc_type or failure.message:
        text.append(f"\n{failure.exc_type or 'error'}: {_short(failure.message or '')}")
    return text


def _short(message: str, lines: int = 6, width: int = 400) -> str:
    kept = message.strip().splitlines()[:lines]
    return "\n".join(line[:width] for line in kept)


def job_detail(job: Job) -> Group:
    spec = job.spec
    summary = Table.grid(padding=(0, 2))
    rows: list[tuple[str, str | Text]] = [
        ("job", job.id),
        ("name", Text(job.name)),
        ("state", state_text(job.state)),
        ("step", f"{job.step}/{spec.steps}"),
        ("loss", "-" if job.loss is None else f"{job.loss:.4f}"),
        ("workers", f"{job.world_size} (min {spec.min_workers}, max {spec.max_workers})"),
        ("generation", str(job.generation)),
        ("recoveries", str(job.recoveries)),
        ("weight", f"{spec.weight:g}"),
        ("submitted", f"{clock(job.submitted_at)} ({ago(job.submitted_at)})"),
    ]
    if job.spec.entrypoint is not None:
        rows.append(("entrypoint", Text(shlex.join(job.spec.entrypoint))))
    if job.last_failure is not None:
        rows.append(("last failure", failure_text(job.last_failure)))
    for key, value in rows:
        summary.add_row(Text(key, style="bold"), value)
    workers = _table("RANK", "NODE", "PID", "STATE", title="workers")
    for worker in sorted(job.workers, key=lambda w: w.rank):
        pid = "-" if worker.pid is None else str(worker.pid)
        workers.add_row(str(worker.rank), worker.node_id, pid, worker.state.value)
    history = _table("AT", "STATE", "REASON", title="history", shrink="REASON")
    for entry in job.history:
        history.add_row(clock(entry.at), state_text(entry.state), Text(entry.reason))
    parts: list[Table] = [summary, workers] if job.workers else [summary]
    return Group(*parts, history)


def nodes_table(nodes: list[NodeRecord]) -> Table:
    table = _table("ID", "STATE", "SLOTS", "USED", "HOST", "LAST HEARTBEAT", shrink="HOST")
    for node in nodes:
        table.add_row(
            node.id,
            state_text(node.state),
            _slots(node),
            str(node.used),
            node.host,
            ago(node.last_heartbeat),
        )
    return table


def _slots(node: NodeRecord) -> str:
    """``8``, or ``7 (GPU 3 retired: Xid 79: …)`` when a GPU was retired as faulty."""
    retired = "; ".join(f"GPU {device} retired: {why}" for device, why in node.retired_gpus.items())
    return f"{node.slots} ({retired})" if retired else str(node.slots)


def _field(value: Any) -> str | None:
    if value is None or isinstance(value, dict):
        return None
    if isinstance(value, list):
        return str(len(value))
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def event_line(seq: int, event: CloudEvent) -> Text:
    """``#seq time type subject key=value…``: scalar fields, timestamps and the subject left out."""
    data = event.data
    at = datetime.fromisoformat(event.time).astimezone().strftime("%H:%M:%S.%f")[:-3]
    parts = [f"{data['old']} → {data['new']}"] if {"old", "new"} <= data.keys() else []
    for key, value in data.items():
        if key in ("old", "new", "message") or key.endswith("_at") or value == event.subject:
            continue
        shown = _field(value)
        if shown is not None:
            parts.append(f"{key}={shown}")
    if data.get("message"):  # one line however many the exception's text has
        parts.append(f"message={_short(str(data['message']), lines=3)!r}")
    if isinstance(data.get("spec"), dict):
        spec = data["spec"]
        parts.append(
            f"steps={spec.get('steps')} workers={spec.get('min_workers')}-{spec.get('max_workers')}"
        )
    return Text.assemble(
        (f"#{seq:<5}", "dim"),
        f" {at}  ",
        (f"{event.type:<22}", "bold"),
        f" {event.subject or '-'}  ",
        "  ".join(parts),
    )
