"""Hang detection from the workers' step heartbeats (docs/design.md §3, online statistics).

Every ``StepCompleted`` a live worker sends is its heartbeat. A worker that completes no step
for longer than ``max(factor * mean, mean + margin)`` is hung, where ``mean`` is a robust
running mean of its step time: the median of its last few reported ``iteration_s`` and of the
gaps between the steps as the agent saw them (whichever is larger), so one slow step — a
checkpoint, a GC pause — moves it not at all. The threshold is also at least
``hang_jitter_factor`` times the longest of those recent gaps: on a busy node a healthy
worker is descheduled for a while now and then, and a stall it just survived is no hang.
Before the first step the floor is ``hang_startup_s`` (imports, rendezvous, checkpoint load)
and until a few steps are seen it is ``hang_warmup_s``, again after each re-formation in place
(the new group's first steps wait for a joiner's first compute and a busy node's new
processes); while the worker says it is writing a checkpoint it is ``hang_checkpoint_s``, and
the checkpoint's time does not count against the step after it.

A hung worker is reported once per (job, generation, rank, last step) as ``WorkerHung`` with
its ``/proc`` state (``T``: stopped by a signal, which never shows up as an exit) and the phase
it last announced. ``WorkerPhase`` lines only feed this module; they never reach the bus.
A job's own entrypoint (a plain script) may never report a step: its workers are watched only
once they have reported something, so a script that does not use the training API is never
taken for hung. A rank that reported a peer's failure and parked waits for a regroup, not for
a step: it is not watched until it re-forms (its park timeout bounds the wait).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from unicron.services.agent.outbox import Report, Sink
from unicron.services.agent.procstat import process_state, runqueue_wait_s
from unicron.services.agent.settings import AgentSettings
from unicron.services.agent.supervisor import Worker
from unicron.shared.contracts.identity import WorkerKey, who
from unicron.shared.contracts.reports import StepCompleted, WorkerException, WorkerHung, WorkerPhase
from unicron.shared.logging import get_logger

log = get_logger(component="hang")
Clock = Callable[[], float]


@dataclass
class Track:
    """What the agent knows about one live worker's progress (monotonic times)."""

    ident: WorkerKey  # who the worker last said it is (a re-formed worker changes generation)
    since: float  # start, last completed step or last re-formation
    window: int
    iterations: deque[float] = field(init=False)
    gaps: deque[float] = field(init=False)
    steps: int = 0
    fresh_steps: int = 0  # steps since the worker started or last re-formed
    last_step: int | None = None
    phase: str | None = None
    suspect_at: float | None = None  # the check that first found it silent for too long
    reported: bool = False
    rejoining: bool = False  # told to re-form in place: the startup floor until its next step
    heard: bool = False  # it has reported a step or a phase
    parked: bool = False  # waiting for a regroup after a peer's failure: no step to expect
    queued_at_since: float | None = None  # its run-queue wait when the silence began

    def __post_init__(self) -> None:
        self.iterations = deque(maxlen=self.window)
        self.gaps = deque(maxlen=self.window)

    def restart_clock(self, at: float) -> None:
        """Silence counts from ``at`` (a step, a re-formation, the end of a checkpoint)."""
        self.since, self.queued_at_since = at, None

    def mean(self) -> float | None:
        """Robust running mean of the step time; None before the first step."""
        if not self.iterations:
            return None
        gap = statistics.median(self.gaps) if self.gaps else 0.0
        return max(statistics.median(self.iterations), gap)


class HangWatch:
    def __init__(
        self,
        settings: AgentSettings,
        live: Callable[[], list[Worker]],
        sink: Sink,
        clock: Clock = time.monotonic,
    ) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.live = live
        self.sink = sink
        self.clock = clock
        self._tracks: dict[WorkerKey, Track] = {}

    # --- input: reports from the local channel -------------------------------------------

    def observe(self, launched: WorkerKey | None, report: Report) -> None:
        """Note a step or a phase of a worker this agent launched (others are not tracked)."""
        if not isinstance(report, StepCompleted | WorkerPhase | WorkerException):
            return
        worker = self._worker(launched or report.key)
        if worker is None:
            return
        track = self._track(worker)
        if isinstance(report, WorkerException):
            track.parked = report.parked
            return
        track.heard = True
        at = self.clock()
        ident = report.key
        if ident != track.ident:  # re-formed in place: that is progress, with a fresh clock
            track.ident, track.reported = ident, False
            track.fresh_steps, track.parked = 0, False
            track.restart_clock(at)
        if isinstance(report, WorkerPhase):
            if track.phase == "checkpoint" and report.phase != "checkpoint":
                track.restart_clock(at)  # a checkpoint is not part of a step: its time is free
            track.phase = report.phase
            return
        if track.fresh_steps:  # the first step after a (re)start waited for more than a step
            track.gaps.append(at - track.since)
        track.iterations.append(report.iteration_s)
        track.steps += 1
        track.fresh_steps += 1
        track.restart_clock(at)
        track.last_step, track.phase = report.step, None
        track.suspect_at, track.reported, track.rejoining = None, False, False
        track.parked = False

    def regrouped(self, worker: Worker) -> None:
        """The worker was told to re-form in place: a fresh clock under its new identity, and
        until its next step the startup floor (it waits for joiners and a state transfer)."""
        track = self._track(worker)
        track.ident, track.phase = worker.current, None
        track.restart_clock(self.clock())
        track.suspect_at, track.reported, track.rejoining = None, False, True
        track.fresh_steps, track.parked = 0, False

    # --- the decision ----------------------------------------------------------------------

    def threshold(self, track: Track) -> float:
        """How long the worker may stay without completing a step."""
        s = self.settings
        mean = track.mean()
        if mean is None:
            limit = s.hang_startup_s
        else:
            limit = max(s.hang_factor * mean, mean + s.hang_margin_s)
            if track.gaps:  # how this worker steps on this node now, stalls included
                limit = max(limit, s.hang_jitter_factor * max(track.gaps))
            if track.fresh_steps < s.hang_warmup_steps:
                limit = max(limit, s.hang_warmup_s)
        if track.phase == "checkpoint":
            limit = max(limit, s.hang_checkpoint_s)
        if track.rejoining:
            limit = max(limit, s.hang_startup_s)
        return limit

    def check(self) -> list[WorkerHung]:
        """One pass over the live workers; publishes and returns the newly hung ones.

        A worker found silent too long is reported at the next pass if still silent: between
        the two the event loop has read whatever its socket held, so a stall of the agent
        itself (CPU starvation, its own GC) cannot pass for a hang of the worker.
        """
        now = self.clock()
        live = [w for w in self.live() if not w.stopping]
        self._tracks = {w.key: self._track(w) for w in live}  # forget the exited
        hung = []
        for worker in live:
            track = self._tracks[worker.key]
            if (worker.plain and not track.heard) or track.parked:
                continue  # a plain script, or a parked rank: no steps to expect
            if finishing(worker, track):
                continue
            silent, limit = self._silent_s(worker, track, now), self.threshold(track)
            if silent <= limit:
                track.suspect_at = None
            elif track.suspect_at is None:
                track.suspect_at = now
            elif not track.reported:
                track.reported = True
                hung.append(self._report(worker, track, silent, limit))
        return hung

    async def run(self) -> None:
        """Check every ``hang_check_interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.settings.hang_check_interval_s)
            try:
                self.check()
            except Exception:  # a bug here must not end hang detection for good
                log.exception("hang check failed")

    # --- helpers ---------------------------------------------------------------------------

    def _silent_s(self, worker: Worker, track: Track, now: float) -> float:
        """Time since its last step, less the time it spent runnable but waiting for a CPU:
        a busy node is not a hung worker."""
        queued = runqueue_wait_s(worker.proc.pid)
        if queued is None:
            return now - track.since
        if track.queued_at_since is None:
            track.queued_at_since = queued  # read within a check interval of the last step
        return now - track.since - (queued - track.queued_at_since)

    def _worker(self, key: WorkerKey) -> Worker | None:
        return next((w for w in self.live() if w.key == key or w.current == key), None)

    def _track(self, worker: Worker) -> Track:
        track = self._tracks.get(worker.key)
        if track is None:
            track = Track(worker.key, worker.started_at, self.settings.hang_window)
            self._tracks[worker.key] = track
        return track

    def _report(self, worker: Worker, track: Track, silent: float, limit: float) -> WorkerHung:
        mean = statistics.median(track.iterations) if track.iterations else None
        report = WorkerHung(
            **who(self.node_id, track.ident),
            pid=worker.proc.pid,
            silent_s=round(silent, 4),
            threshold_s=round(limit, 4),
            mean_iteration_s=mean,
            process_state=process_state(worker.proc.pid),
            phase=track.phase,
            last_step=track.last_step,
        )
        self.sink.report(report)
        log.warning(
            "worker hung",
            job_id=report.job_id,
            generation=report.generation,
            rank=report.rank,
            pid=report.pid,
            silent_s=report.silent_s,
            threshold_s=report.threshold_s,
            process_state=report.process_state,
            phase=report.phase,
            last_step=report.last_step,
        )
        return report


def finishing(worker: Worker, track: Track) -> bool:
    """It did the job's last step: what is left (the last checkpoint, the script's own
    epilogue, leaving the group) has no step to wait for, so silence is no hang."""
    if track.last_step is None or worker.last_step is None:
        return False
    return track.last_step >= worker.last_step
