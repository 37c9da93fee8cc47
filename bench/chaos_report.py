"""The human side of a chaos run's result: what happened to each kind of fault, what each kill
overlapped, how each job ended, the node losses the bench did not cause, and why each slow
recovery was slow."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.chaos_audit import Audit
from bench.chaos_exact import Exactness
from bench.chaos_losses import FalseNodeLoss
from bench.chaos_plan import FAILING_KINDS, ChaosPlan
from bench.chaos_procs import StackProcess
from bench.chaos_records import ChaosLog, SubmittedJob
from bench.chaos_slow import SLOW_S, SlowRecovery, slow_recoveries
from bench.harness import median, percentile


@dataclass
class ChaosResult:
    plan: ChaosPlan
    log: ChaosLog
    audit: Audit
    submitted: list[SubmittedJob]
    jobs: dict[str, dict[str, Any]]
    exactness: dict[str, Exactness]
    orphans: list[StackProcess]
    data_dir: Path
    wall_s: float


def _s(value: float | None) -> str:
    if value == math.inf:
        return "never"
    return "-" if value is None or value != value else f"{value:.3f}"


def _diff(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def run_start(log: ChaosLog) -> float:
    """The time the tables count seconds from: the first fault's injection."""
    return min((i.at for i in log.injections), default=0.0)


def _faults_table(audit: Audit) -> Table:
    table = Table(title="Chaos: injected faults → failure.detected → recovery (s)")
    for column in ("fault", "injected", "detected once", "missed", "duplicate",
                   "misattributed", "p50", "p99", "max", "during a kill",
                   "outside kills"):  # fmt: skip
        table.add_column(column, justify="left" if column == "fault" else "right")
    for kind in [k.value for k in FAILING_KINDS] + ["all"]:
        rows = [o for o in audit.outcomes if kind in ("all", o.injection.fault.kind.value)]
        times = [o.recovered_in for o in rows if o.recovered_in is not None]
        killed = [o.recovered_in for o in rows if o.recovered_in is not None and o.kills]
        quiet = [o.recovered_in for o in rows if o.recovered_in is not None and not o.kills]
        table.add_row(
            kind, str(len(rows)), str(sum(len(o.failures) == 1 for o in rows)),
            str(sum(not o.failures for o in rows)),
            str(sum(max(0, len(o.failures) - 1) for o in rows)),
            str(sum(o.misattributed for o in rows)), _s(median(times)),
            _s(percentile(times, 99)), _s(max(times, default=None)),
            f"{len(killed)} (max {_s(max(killed, default=None))})",
            f"{len(quiet)} (p99 {_s(percentile(quiet, 99))})",
        )  # fmt: skip
    return table


def _actions_table(result: ChaosResult) -> Table:
    table = Table(title="Chaos: kill -9 and restart")
    for column in ("target", "after fault", "killed at s", "down s", "back after s",
                   "recoveries it overlapped"):  # fmt: skip
        table.add_column(column, justify="left" if column == "target" else "right")
    start = run_start(result.log)
    for record in result.log.actions:
        plan = record.plan
        overlapped = [o for o in result.audit.outcomes if record in o.kills]
        back = record.back_at - record.killed_at if record.back_at else None
        table.add_row(
            plan.target, f"lane {plan.lane} #{plan.order} +{plan.delay_s:.2f}s",
            f"{record.killed_at - start:.1f}", f"{record.restarted_at - record.killed_at:.2f}",
            _s(back), ", ".join(_s(o.recovered_in) for o in overlapped) or "-",
        )  # fmt: skip
    return table


def _jobs_table(result: ChaosResult) -> Table:
    table = Table(title="Chaos: jobs against their failure-free reference")
    for column in ("job", "workload", "state", "step", "recoveries", "params max rel diff",
                   "ledger", "redone steps"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("job", "workload") else "right")
    for submitted in result.submitted:
        job, exact = result.jobs[submitted.job_id], result.exactness[submitted.job_id]
        ledger = "exact" if exact.ledger_exact else exact.problem or "-"
        table.add_row(
            f"{submitted.job_id} (lane {submitted.lane})", submitted.workload, job["state"],
            f"{job['step']}/{result.plan.steps}", str(job["recoveries"]),
            _diff(exact.max_relative_diff), ledger, str(exact.redone_steps),
        )  # fmt: skip
    return table


def _slow_table(slow: list[SlowRecovery]) -> Table:
    table = Table(title=f"Chaos: why each recovery over {SLOW_S:g} s was slow (slowest first)")
    for column in ("job", "gen", "fault", "recorded as", "recovery s", "downtime s",
                   "phases s", "waited on"):  # fmt: skip
        table.add_column(column)
    for row in slow:
        o = row.outcome
        first, done = o.failures[0], o.transition or {}
        phases = " ".join(f"{k}={v:.2f}" for k, v in row.phases.items())
        table.add_row(
            o.injection.job_id, str(first["generation"]),
            f"{o.injection.fault.kind.value} r{o.injection.fault.rank}",
            f"{first['kind']}/{first['category']} r{first['rank']}", _s(o.recovered_in),
            _s(done.get("downtime_s")), phases or "-", "; ".join(row.waited_on) or "-",
        )  # fmt: skip
    return table


def _loss_seen_as(loss: FalseNodeLoss) -> str:
    """The event a false node loss was seen in: the node's, or one job's failure."""
    failure = loss.failure
    if failure is None:
        return "node.lost"
    return f"failure {failure['job_id']} g{failure['generation']} r{failure['rank']}"


def _false_losses_table(losses: list[FalseNodeLoss], start: float) -> Table:
    table = Table(title="Chaos: false node losses (the bench never killed these nodes' agents)")
    for column in ("node", "what", "last heartbeat s", "declared s", "after kill",
                   "kill before s"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("node", "what") else "right")
    for loss in sorted(losses, key=lambda loss: loss.declared_at):
        table.add_row(
            loss.node_id, _loss_seen_as(loss), f"{loss.last_heartbeat - start:.1f}",
            f"{loss.declared_at - start:.1f}", loss.after.plan.target if loss.after else "-",
            _s(loss.kill_lead_s),
        )  # fmt: skip
    return table


def notes(result: ChaosResult) -> list[str]:
    """One line per thing that went wrong or needs a look, for a person or a test message."""
    notes = list(result.log.notes)
    notes += [f"unexpected exit: {e}" for e in result.log.unexpected_exits]
    notes += [f"orphan: {p.describe()}" for p in result.orphans]
    for o in result.audit.outcomes:
        fault = o.injection
        if not fault.warm:
            notes.append(f"no warm spare on the node of {fault.job_id} g{fault.generation}")
        if not o.failures:
            notes.append(f"missed: {fault.job_id} g{fault.generation} {fault.body}")
        for extra in o.failures[1:]:
            notes.append(
                f"duplicate for {fault.job_id} g{fault.generation} {fault.fault.kind.value}: "
                f"g{extra['generation']} {extra['kind']}/{extra['category']} r{extra['rank']}"
            )
    for failure in result.audit.unexplained:
        notes.append(
            f"unexplained failure: {failure['job_id']} g{failure['generation']} "
            f"{failure['kind']}/{failure['category']} r{failure['rank']}"
        )
    for loss in result.audit.false_node_losses:
        after = (
            f"{_s(loss.kill_lead_s)} s after the {loss.after.plan.target} kill"
            if loss.after
            else "with no kill before it"
        )
        notes.append(f"false node loss: {loss.node_id} declared lost {after}")
    if result.audit.agent_recoveries:
        times = ", ".join(_s(t) for t in result.audit.agent_recoveries)
        notes.append(f"agent kill: {len(result.audit.agent_failures)} failures, recoveries {times}")
    return notes


def print_tables(result: ChaosResult) -> None:
    console = Console(width=200, stderr=False)
    console.print(_faults_table(result.audit))
    console.print(_actions_table(result))
    console.print(_jobs_table(result))
    losses = result.audit.false_node_losses + result.audit.false_loss_failures
    console.print(_false_losses_table(losses, run_start(result.log)))
    console.print(_slow_table(slow_recoveries(result.audit.outcomes)))
    for note in notes(result):
        console.print(f"[yellow]{note}[/yellow]")
    console.print(f"advisory failures (stragglers, no recovery): {result.audit.advisory}")
    console.print(f"data and logs: {result.data_dir} ({result.wall_s:.0f} s)")
