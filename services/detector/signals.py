"""Turn one raw report (a worker exit, an in-band exception) into a failure candidate.

A candidate says what was seen and how sure we are that it is the root cause: a rank killed from
outside (SIGKILL) is a root cause; a connection error in a collective is usually what a peer's
death looks like from the survivors, so it waits for a better explanation (see :mod:`correlate`).
So does the way a process dies of an error it may have explained itself, in a report that can
arrive after its exit: an exit with code 1 (an uncaught Python exception) or a signal the process
raised on itself (SIGABRT, SIGSEGV: torch can abort in teardown after the script's exception).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from unicron.shared.contracts.identity import WorkerKey
from unicron.shared.contracts.reports import WorkerException, WorkerExited, WorkerHung
from unicron.shared.contracts.taxonomy import (
    CODE_SIGNALS,
    FailureCategory,
    FailureKind,
    signal_death,
)

# Categories that survivors of a peer's death report; never preferred over a real cause.
SECONDARY_CATEGORIES = frozenset(
    {
        FailureCategory.CONNECTION_RESET,
        FailureCategory.CONNECTION_REFUSED,
        FailureCategory.NETWORK_OTHER,
        FailureCategory.LINK_FLAPPING,
        FailureCategory.NCCL_TIMEOUT,
        FailureCategory.NCCL_ERROR,
    }
)

# Higher wins when several candidates explain one fault.
_KIND_RANK = {
    FailureKind.NODE_LOST: 50,
    FailureKind.HARDWARE: 45,  # a faulty GPU explains the crash of a rank that ran on it
    FailureKind.CRASH: 40,
    FailureKind.EXCEPTION: 30,
    FailureKind.HANG: 25,
    FailureKind.EXIT: 20,
    FailureKind.STRAGGLER: 10,
}


@dataclass(frozen=True)
class Candidate:
    job_id: str
    generation: int
    node_id: str | None
    rank: int | None
    kind: FailureKind
    category: FailureCategory
    observed_at: float
    evidence: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        node_id: str,
        seat: WorkerKey,
        kind: FailureKind,
        category: FailureCategory,
        observed_at: float,
        evidence: dict[str, Any],
    ) -> Candidate:
        """A candidate blaming the rank at ``seat`` (job, generation, rank) on ``node_id``."""
        return cls(
            job_id=seat.job_id,
            generation=seat.generation,
            node_id=node_id,
            rank=seat.rank,
            kind=kind,
            category=category,
            observed_at=observed_at,
            evidence=evidence,
        )

    @property
    def secondary(self) -> bool:
        """Not surely a root cause: likely an effect of another rank's fault, or an exit its own
        process may have explained in a report still on its way."""
        if self.kind == FailureKind.HANG:
            # Peers of a rank that hangs in its compute wait for it in the collective.
            return self.evidence.get("phase") == "collective" and not self.stopped
        if self.kind == FailureKind.EXIT:
            # Code 1 is an uncaught exception; a failed worker found in the job records alone
            # (the reconcile) has its exit report, which may name a signal, on its way.
            return self.evidence.get("exit_code") == 1 or "found_by" in self.evidence
        if self.kind == FailureKind.CRASH:
            return self.evidence.get("signal") in CODE_SIGNALS
        return self.peer_error

    @property
    def peer_error(self) -> bool:
        """A connection or collective error: what a rank sees of another's fault."""
        return self.category in SECONDARY_CATEGORIES

    @property
    def explainable(self) -> bool:
        """An exit the exception its own process reported may explain (see ``root_cause``)."""
        return self.kind in (FailureKind.EXIT, FailureKind.CRASH) and self.secondary

    @property
    def stopped(self) -> bool:
        return self.evidence.get("process_state") == "T"

    @property
    def lives_on(self) -> bool:
        """The rank's process stays, parked with its memory for a regroup (a peer broke its
        collective): the one kind of failed rank a reattempt can take back in place."""
        return self.kind == FailureKind.EXCEPTION and bool(self.evidence.get("parked"))

    @property
    def waiting(self) -> bool:
        """Alive and waiting on its peers: parked after a broken collective, or silent in one."""
        return self.lives_on or (self.kind == FailureKind.HANG and self.secondary)

    @property
    def tier(self) -> int:
        """How well this explains a fault: surely a cause, then an exit or a signal of the rank
        itself, then a peer error, then a rank that only waits on its peers."""
        if not self.secondary:
            return 3
        if self.waiting:
            # Explains nothing another report explains: even an exit with code 1 (which alone
            # looks secondary too) names the rank they wait for.
            return 0
        # What a rank saw of another's failure: any exit, exception or signal of another rank
        # explains it, never the reverse.
        return 1 if self.peer_error else 2

    @property
    def priority(self) -> tuple[int, int, float]:
        return (self.tier, _KIND_RANK[self.kind], -self.observed_at)


def from_exit(report: WorkerExited) -> Candidate | None:
    """A non-zero exit the agent did not cause; None for clean or agent-requested exits."""
    if report.stopped_by_agent or report.exit_code == 0:
        return None
    evidence: dict[str, Any] = {
        "pid": report.pid, "exit_code": report.exit_code, "signal": report.signal,
    }  # fmt: skip
    if report.signal is None:
        kind, category = FailureKind.EXIT, FailureCategory.EXITED_ABNORMALLY
    else:
        death = signal_death(report.signal)
        kind, category = FailureKind.CRASH, death.category
        evidence |= {"exc_type": death.name, "message": death.message}
    return Candidate.of(report.node_id, report.key, kind, category, report.at, evidence)


def from_exception(report: WorkerException) -> Candidate:
    # an unknown category already reads as software_other (shared/contracts/reports.py)
    return Candidate.of(
        report.node_id,
        report.key,
        FailureKind.EXCEPTION,
        report.category,
        report.at,
        {
            "pid": report.pid,
            "exc_type": report.exc_type,
            "message": report.message[:2000],
            "step": report.step,
            "launch_failed": report.launch_failed,
            "parked": report.parked,
        },
    )


def from_hang(report: WorkerHung) -> Candidate:
    return Candidate.of(
        report.node_id,
        report.key,
        FailureKind.HANG,
        FailureCategory.TASK_HANG,
        report.at,
        {
            "pid": report.pid,
            "silent_s": round(report.silent_s, 3),
            "threshold_s": round(report.threshold_s, 3),
            "mean_iteration_s": report.mean_iteration_s,
            "process_state": report.process_state,
            "phase": report.phase,
            "last_step": report.last_step,
        },
    )


def root_cause(candidates: list[Candidate]) -> Candidate:
    """The candidate that best explains the others. A rank's exit that the exception its own
    process reported explains gives way to it: a survivor that died of SIGABRT after a peer
    error is that peer error, a script that raised and then aborted in teardown its exception.
    A parked rank's report said it lives on: its later exit is news, not explained by it."""
    told = {_process(c) for c in candidates if c.kind == FailureKind.EXCEPTION and not c.lives_on}
    own = [c for c in candidates if not (c.explainable and _process(c) in told)]
    return max(own, key=lambda c: c.priority)


def _process(candidate: Candidate) -> tuple[str | None, int | None, object]:
    return candidate.node_id, candidate.rank, candidate.evidence.get("pid")
