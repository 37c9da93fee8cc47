"""``unicron plan [PLAN_ID] [--explain]``: what the planner decided, and why.

Without ``--explain``: one row per job — action, workers old → new, parallel configuration,
predicted throughput and WAF, predicted downtime, reason. With it, per job: both
configurations with their step times, the transition and where its state comes from, the
expected reward, and the best alternatives that lost, each with the expected reward of the best
plan that would have made it and how far short of the chosen plan that falls; for a job given
no workers, "waiting since <time> (<how long>): <why>" (planning/waiting.py).
"""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text
from unicron.cli.common import ApiUrl, api, console, json_output, print_json
from unicron.cli.render import clock
from unicron.planning.waiting import scaled
from unicron.shared.contracts.plans import JobAllocation, JobExplanation, ParallelConfig, Plan

from unicron.async_client import DEFAULT_API_URL

QUIET_ACTIONS = ("keep", "wait")


def flops(value: float) -> str:
    return scaled(value, "FLOP/s") if value else "-"


def work(value: float) -> str:
    """An expected reward: FLOP/s x seconds, i.e. floating-point operations."""
    return scaled(value, "FLOP")


def seconds(value: float) -> str:
    if value >= 2 * 86400:
        return f"{value / 86400:.1f} days"
    if value >= 7200:
        return f"{value / 3600:.1f} h"
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.3g} s"


def layout(config: ParallelConfig | None, steps: bool = False) -> str:
    if config is None:
        return "-"
    text = f"TP{config.tp}·PP{config.pp}·DP{config.dp} mb{config.micro_batch}"
    if steps and config.iteration_s is not None:
        text += f", {seconds(config.iteration_s)}/step"
    return text


def header(plan: Plan) -> Text:
    at = clock(plan.created_at)
    top = f"plan {plan.id}  #{plan.seq}  epoch {plan.epoch}  {at}  trigger: {plan.trigger}"
    rate = plan.failure_rate_per_gpu_h
    parts = [
        f"cluster {plan.cluster or '?'} ({plan.unit_slots} slots a unit)",
        f"D_run {seconds(plan.run_s)}" + (f" (failures {rate:.2g}/GPU-hour)" if rate else ""),
        f"expected WAF {flops(plan.expected_waf)}",
        f"expected reward {work(plan.expected_reward)}",
        f"{plan.free_slots} slots free",
        f"fairness {plan.fairness.value}",
        f"planned in {plan.planning_ms:.0f} ms",
    ]
    return Text.assemble((top, "bold"), "\n", " · ".join(parts))


def summary_table(plan: Plan) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("JOB", "ACTION", "WORKERS", "CONFIG", "T", "WAF", "DOWNTIME", "REASON"):
        table.add_column(column, no_wrap=column != "REASON", overflow="fold")
    for a in plan.allocations:
        why = a.explanation
        style = "dim" if a.action.value in QUIET_ACTIONS else ""
        table.add_row(
            a.job_id,
            Text(a.action.value, style=style),
            f"{a.previous_workers} → {a.workers}",
            layout(a.config),
            flops(a.predicted_throughput),
            flops(why.predicted_waf) if why else "-",
            seconds(why.predicted_downtime_s) if why and why.transition != "none" else "-",
            Text(a.reason),
        )
    return table


def _calibration(why: JobExplanation) -> str:
    if why.calibration == 1.0:
        return "model not yet calibrated by this job's steps"
    return f"steps measured {why.calibration:.2g}x the model's time"


def _transition(why: JobExplanation) -> str:
    if why.transition == "none":
        return "none: it keeps running as it is" if why.old_workers else "none: it keeps waiting"
    source = f", state from {why.state_source}" if why.state_source != "none" else ""
    model = f" (modelled x {why.downtime_factor:.2f} measured)" if why.downtime_factor != 1 else ""
    redo = why.predicted_lost_work_s
    lost = f", {seconds(redo)} of work redone" if redo else ""
    return f"{why.transition}{source}: downtime {seconds(why.predicted_downtime_s)}{model}{lost}"


def waiting(a: JobAllocation) -> str | None:
    """The "since <time> (<how long>): <why>" of a job the plan gives no workers."""
    if a.workers or a.waiting_reason is None:
        return None
    if a.waiting_since is None:  # it runs until this plan stops it
        return f"from this plan: {a.reason}"
    waited = seconds(max(0.0, time.time() - a.waiting_since))
    return f"since {clock(a.waiting_since)} ({waited}): {a.reason}"


def _weight(why: JobExplanation) -> str:
    aged = f", aged x{why.weight_factor:.3g}" if why.weight_factor != 1.0 else ""
    kept = f", guaranteed {why.guaranteed_workers} workers" if why.guaranteed_workers else ""
    return f"weight {why.weight:g}{aged}{kept}"


def explain_job(a: JobAllocation, plan: Plan) -> Group:
    why = a.explanation
    title = Text.assemble(
        (a.job_id, "bold"), f"  {a.action.value} {a.previous_workers} → {a.workers} workers"
    )
    if why is None:
        return Group(title, Text(f"  {a.reason}"))
    grid = Table.grid(padding=(0, 2))
    waits = waiting(a)
    rows = [("waiting", waits)] if waits else [("why", a.reason)]
    rows += [
        ("configuration", f"{layout(why.old_config, True)}  →  {layout(why.new_config, True)}"),
        (
            "throughput",
            f"{flops(why.predicted_throughput_old)} → {flops(why.predicted_throughput)}"
            f"  ({_weight(why)}, WAF {flops(why.predicted_waf)}, {_calibration(why)})",
        ),
        ("transition", _transition(why)),
        ("expected reward", f"{work(why.reward)} over D_run {seconds(plan.run_s)}"),
    ]
    for key, value in rows:
        grid.add_row(Text("  " + key, style="bold"), Text(value))
    parts: list[Text | Table] = [title, grid]
    if why.alternatives:
        parts.append(Text("  alternatives that lost:", style="bold"))
        lost = Table.grid(padding=(0, 2))
        for alt in why.alternatives:
            share = alt.shortfall / abs(plan.expected_reward) if plan.expected_reward else 0.0
            lost.add_row(
                f"    {alt.workers} workers",
                layout(alt.config),
                flops(alt.predicted_throughput),
                f"plan reward {work(alt.plan_reward)}",
                f"short by {work(alt.shortfall)} ({share:.2%})",
            )
        parts.append(lost)
    return Group(*parts)


def render(plan: Plan, explain: bool) -> Group:
    if not explain:
        return Group(header(plan), Text(""), summary_table(plan))
    jobs = [explain_job(a, plan) for a in plan.allocations]
    spaced = [part for job in jobs for part in (Text(""), job)]
    return Group(header(plan), *spaced)


def plan(
    plan_id: Annotated[
        str | None, typer.Argument(help="The plan to show (default: the latest).")
    ] = None,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain", "-e", help="Per job: configurations, costs and the alternatives that lost."
        ),
    ] = False,
    api_url: ApiUrl = DEFAULT_API_URL,
) -> None:
    """Show the planner's latest plan (or PLAN_ID): who gets which GPUs, and why."""
    with api(api_url) as client:
        found = client.plan(plan_id)
    if json_output():
        print_json(found)
        return
    console().print(render(found, explain))
