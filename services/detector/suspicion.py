"""A silent node is a suspect, not a loss, until the silence is corroborated (docs/design.md §6).

A heartbeat that does not land in Redis says that the node, Redis, the path between them or the
detector itself is slow or gone; only the first is the node's fault. Before a node is declared
lost the detector weighs what else it knows, and deciding (:func:`judge`, a pure function) is
kept apart from gathering (:class:`Suspicion`):

- **the agent's answer** to a direct question over NATS (core request/reply, asked once the node
  has missed all but its last beat, so the answer is in by the node's deadline): an answer from
  the boot that wrote the record clears the node for a heartbeat interval — decisive; an answer
  from another boot, or the server's word that nobody listens on the node's subject, condemns it
  — decisive, while the detector's own bus has been up long enough for agents to have
  resubscribed;
- **its workers' reports** arriving over the bus (stamped within a heartbeat interval): they come
  through the agent, so the node is alive — strong;
- **the observer's doubt**: a detector whose bus is down or just reconnected, or whose own loop
  ran late (starved of CPU: its questions may have timed out on its side), cannot tell a silent
  node from a deaf observer — the verdict waits;
- **many nodes silent at once** (more than two, and at least ``mass_silence_share`` of those in
  service: Kubernetes' unhealthy-zone rule) with no answer is the observer's or the bus's
  problem, not theirs — the verdict waits, unless
- **the peers' connection errors**: ranks on other nodes that lost their connections to a job on
  the silent node confirm an unanswered silence.

No doubt lasts for ever: a node silent for ``suspicion_hold_s`` past its deadline, unanswered,
is lost whatever the observer thinks of itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from unicron.services.detector.settings import DetectorSettings
from unicron.services.detector.signals import SECONDARY_CATEGORIES
from unicron.shared.bus.api import EventBus
from unicron.shared.contracts.messages import ping_subject
from unicron.shared.contracts.models import Job, NodeRecord, WorkerState, now
from unicron.shared.contracts.reports import WorkerException

JobReader = Callable[[str], Awaitable[Job | None]]


class NodeVerdict(str, Enum):
    LOST = "lost"
    ALIVE = "alive"  # silent in Redis, but heard otherwise: the control plane's blip
    UNDECIDED = "undecided"  # the observer cannot tell now; asked again at the next check


class AgentAnswer(str, Enum):
    """What came back when the detector asked a node's agent whether it lives."""

    THIS_BOOT = "this_boot"  # the boot that wrote the node's record answered
    OTHER_BOOT = "other_boot"  # the node restarted: the record's boot and its workers are gone
    NO_RESPONDERS = "no_responders"  # the server says nobody listens on the node's subject
    NO_ANSWER = "no_answer"  # nothing came back in time
    NOT_ASKED = "not_asked"  # the detector's own bus could not send the question


async def ask_agent(
    bus: EventBus, node_id: str, boot_id: str | None, timeout_s: float
) -> AgentAnswer:
    """Ask the node's agent over core NATS; ``boot_id`` None takes any boot's answer."""
    if not bus.connected:
        return AgentAnswer.NOT_ASKED
    try:
        reply = await bus.request(ping_subject(node_id), b"", timeout_s)
    except NoRespondersError:
        return AgentAnswer.NO_RESPONDERS
    except (NatsTimeoutError, TimeoutError):
        return AgentAnswer.NO_ANSWER
    except Exception:  # the client was closed or is reconnecting: we could not ask
        return AgentAnswer.NOT_ASKED
    if boot_id is not None and reply.decode(errors="replace") != boot_id:
        return AgentAnswer.OTHER_BOOT
    return AgentAnswer.THIS_BOOT


@dataclass(frozen=True)
class Evidence:
    """Everything the detector knows of one silent node at the moment it judges it."""

    silent_s: float  # since its last heartbeat (or since the detector could hear)
    answer: AgentAnswer  # the agent's latest answer
    answer_age_s: float  # how long ago that answer came
    reported_s: float | None  # since its latest report on the bus, by the report's stamp
    observer_doubt: str | None  # why the detector doubts its own hearing now; None: it does not
    mass_silence: bool  # many nodes silent at once
    peers_cut: bool  # ranks on other nodes lost their connection to a job of this node


@dataclass(frozen=True)
class Verdict:
    verdict: NodeVerdict
    why: str


def judge(evidence: Evidence, settings: DetectorSettings) -> Verdict:
    """The verdict on a node silent past its deadline (the weights in the module docstring)."""
    e, fresh_s = evidence, settings.heartbeat_interval_s
    if e.answer == AgentAnswer.THIS_BOOT and e.answer_age_s <= fresh_s:
        return Verdict(NodeVerdict.ALIVE, "its agent answered")
    if e.reported_s is not None and e.reported_s <= fresh_s:
        return Verdict(NodeVerdict.ALIVE, "its workers' reports arrive")
    if e.answer == AgentAnswer.OTHER_BOOT:
        return Verdict(NodeVerdict.LOST, "another boot of the node answered")
    if e.silent_s > settings.node_timeout_s + settings.suspicion_hold_s:
        return Verdict(NodeVerdict.LOST, "silent and unanswered past the suspicion hold")
    if e.observer_doubt is not None:
        return Verdict(NodeVerdict.UNDECIDED, e.observer_doubt)
    if e.answer == AgentAnswer.NO_RESPONDERS:
        return Verdict(NodeVerdict.LOST, "no agent listens on its subject")
    if e.answer == AgentAnswer.NO_ANSWER:
        if e.peers_cut:
            return Verdict(NodeVerdict.LOST, "no answer, and its peers lost their connections")
        if e.mass_silence:
            return Verdict(NodeVerdict.UNDECIDED, "most nodes silent at once: not theirs")
        return Verdict(NodeVerdict.LOST, "its agent did not answer")
    return Verdict(NodeVerdict.UNDECIDED, "no fresh answer from its agent yet")


def mass_silence(silent: int, in_service: int, settings: DetectorSettings) -> bool:
    """More than two nodes, and most of those in service, silent together."""
    return silent > 2 and silent >= settings.mass_silence_share * max(in_service, 1)


@dataclass
class _Question:
    boot_id: str
    task: asyncio.Task[AgentAnswer]
    answered_at: float = 0.0

    def done(self, _: asyncio.Task[AgentAnswer]) -> None:
        self.answered_at = now()


class Suspicion:
    """Gathers the evidence on silent nodes: asks their agents, hears their reports, watches the
    detector's own hearing."""

    def __init__(self, bus: EventBus, settings: DetectorSettings) -> None:
        self.bus = bus
        self.settings = settings
        self._questions: dict[str, _Question] = {}
        self._reported: dict[str, float] = {}  # node → latest report stamp
        self._peer_errors: dict[str, dict[str, float]] = {}  # job → node → latest error stamp
        # Settled from the start: a detector's first hearing is guarded by its Hearing.
        self._connected_since: float | None = float("-inf")
        self._late_at = float("-inf")  # when the detector's loop last woke late
        self._late_s = 0.0

    # --- what the detector hears --------------------------------------------------------

    def heard(self, node_id: str, at: float) -> None:
        """A report from the node's agent, stamped ``at``."""
        self._reported[node_id] = max(at, self._reported.get(node_id, at))

    def heard_exception(self, report: WorkerException) -> None:
        self.heard(report.node_id, report.at)
        if report.category not in SECONDARY_CATEGORIES:
            return
        old = report.at - self.settings.node_timeout_s
        for job_id in [j for j, seen in self._peer_errors.items() if max(seen.values()) < old]:
            del self._peer_errors[job_id]  # too old to confirm anything
        self._peer_errors.setdefault(report.job_id, {})[report.node_id] = report.at

    def woke(self, late_s: float) -> None:
        """The detector's loop woke ``late_s`` after it meant to."""
        if late_s >= self.settings.ping_timeout_s:
            self._late_at, self._late_s = now(), late_s

    def observe(self, at: float) -> None:
        """Note whether the detector's bus is up, at every check: a reconnect between two
        verdicts must still be known at the next one."""
        if not self.bus.connected:
            self._connected_since = None
        elif self._connected_since is None:
            self._connected_since = at

    def doubt(self, at: float) -> str | None:
        """Why the detector cannot trust its own hearing at ``at``; None when it can."""
        self.observe(at)
        grace = self.settings.node_timeout_s
        if self._connected_since is None:
            return "the detector's bus is down"
        if at - self._connected_since < grace:
            return "the detector's bus reconnected moments ago"
        if at - self._late_at < grace:
            return f"the detector's own loop ran {self._late_s:.2f}s late"
        return None

    # --- asking ---------------------------------------------------------------------------

    def suspect(self, node: NodeRecord, at: float) -> None:
        """The node missed all but its last beat: ask its agent, to have the answer by its
        deadline. Asked again once an answer is older than a heartbeat interval."""
        question = self._questions.get(node.id)
        if question is not None and question.boot_id == node.boot_id:
            stale = at - question.answered_at > self.settings.heartbeat_interval_s
            if not (question.task.done() and stale):
                return
        # The answer is due by the node's deadline, the time for one answer at the least.
        deadline = self.settings.node_timeout_s - node.silent_s(at)
        timeout = max(self.settings.ping_timeout_s, deadline)
        ask = ask_agent(self.bus, node.id, node.boot_id, timeout)
        question = _Question(node.boot_id, asyncio.create_task(ask, name=f"ask {node.id}"))
        question.task.add_done_callback(question.done)
        self._questions[node.id] = question

    async def answer(self, node: NodeRecord, at: float) -> tuple[AgentAnswer, float]:
        """The agent's latest answer and its age, waiting for a question in flight."""
        self.suspect(node, at)
        question = self._questions[node.id]
        answer = await question.task
        return answer, max(0.0, now() - question.answered_at)

    def cleared(self, node_ids: Iterable[str]) -> None:
        """These nodes beat again: forget the questions about them."""
        for node_id in node_ids:
            question = self._questions.pop(node_id, None)
            if question is not None and not question.task.done():
                question.task.cancel()

    def asking(self) -> set[str]:
        return set(self._questions)

    async def close(self) -> None:
        tasks = [q.task for q in self._questions.values()]
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)

    # --- the evidence ----------------------------------------------------------------------

    async def evidence(
        self, node: NodeRecord, silent_s: float, get_job: JobReader, mass: bool
    ) -> Evidence:
        at = now()
        answer, age = await self.answer(node, at)
        reported = self._reported.get(node.id)
        return Evidence(
            silent_s=silent_s,
            answer=answer,
            answer_age_s=age,
            reported_s=None if reported is None else max(0.0, now() - reported),
            observer_doubt=self.doubt(now()),
            mass_silence=mass,
            peers_cut=await self._peers_cut(node.id, get_job, at),
        )

    async def _peers_cut(self, node_id: str, get_job: JobReader, at: float) -> bool:
        """A rank on another node lost its connection, lately, in a job with a live rank here.
        Only the jobs with such an error are read: usually none."""
        recent = at - self.settings.node_timeout_s
        for job_id, errors in list(self._peer_errors.items()):
            if not any(n != node_id and t >= recent for n, t in errors.items()):
                continue
            job = await get_job(job_id)
            if job is not None and any(
                w.node_id == node_id and w.state in (WorkerState.LAUNCHING, WorkerState.RUNNING)
                for w in job.workers
            ):
                return True
        return False
