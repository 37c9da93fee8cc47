"""The chaos run itself (:mod:`bench.chaos`): each lane's jobs on a live stack, their faults
injected through the admin API one recovery at a time.

A job gets its next fault only once it recovered from the previous one and trained the fault's
``gap`` steps (and far enough for the detector not to take it for the same fault coming back,
docs/design.md §3), because the detector records one failure per job generation by design.
The bench reads the stack only through its REST API, which it polls; it never reads Redis or
the bus directly. The kills and restarts are :mod:`bench.chaos_kills`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from unicron.cli.stack import Stack

from bench.chaos_plan import WORLD, ChaosPlan, FaultPlan
from bench.chaos_records import ChaosLog, Injection, SubmittedJob, progress

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
ESCALATION_STEPS = 10  # the detector's default ``escalation_steps``
POLL_S = 0.1
FAULT_READY_TIMEOUT_S = 180.0  # for the job to be whole and far enough for its next fault
RECOVERY_TIMEOUT_S = 120.0
JOB_END_TIMEOUT_S = 180.0
# A fault needs this many steps left in the job: it strikes, and the job recovers and steps
# on, well before its workers finish (a fault for a finished worker would never strike).
END_MARGIN_STEPS = 300
OUTAGE_TIMEOUT_S = 90.0
LOST_ANSWER_WAIT_S = 10.0  # for a fault whose answer was lost to show that it struck
# How long a due fault waits for a warm spare on its rank's node (then it strikes without one).
SPARE_WAIT_S = 30.0
Job = dict[str, Any]


class ChaosDriver:
    def __init__(self, stack: Stack, api: httpx.AsyncClient, plan: ChaosPlan) -> None:
        self.stack = stack
        self.api = api
        self.plan = plan
        self.log = ChaosLog()
        self.submitted: list[SubmittedJob] = []
        self.jobs: dict[str, Job] = {}  # the latest poll of each job
        self.nodes: dict[str, dict[str, Any]] = {}  # and of each node
        self.floor: dict[str, int] = {}  # the step a job's next fault counts its gap from
        self.last_change = 0.0  # when a fault was last injected or a job last recovered
        self.gate = asyncio.Event()  # closed while an agent kill waits for a quiet cluster
        self.gate.set()
        self.in_flight = 0  # faults injected and not yet recovered from
        self.api_lock = asyncio.Lock()  # held while the bench keeps the API or a server down
        # what else to do once a fault is injected, and before waiting for the jobs to end
        self.injection_hooks: list[Callable[[Injection], None]] = []
        self.finish_hooks: list[Callable[[], Awaitable[None]]] = []

    @property
    def job_ids(self) -> list[str]:
        return [job.job_id for job in self.submitted]

    async def call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """A request retried through an outage (refused connection, 503) for a while."""
        deadline = time.monotonic() + OUTAGE_TIMEOUT_S
        while True:
            try:
                response = await self.api.request(method, url, **kwargs)
                if response.status_code != 503 or time.monotonic() > deadline:
                    return response
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)

    async def submit(self, lane: int) -> str:
        workload = self.plan.workload(lane)
        name = f"chaos-{lane}-{sum(j.lane == lane for j in self.submitted)}-{workload}"
        response = await self.call("POST", "/v1/jobs", json=self.plan.spec(workload, name))
        response.raise_for_status()
        job_id = str(response.json()["id"])
        self.submitted.append(SubmittedJob(lane, workload, job_id))
        self.floor[job_id] = 0
        progress(f"lane {lane}: {job_id} submitted ({name})")
        return job_id

    async def poll(self, stop: asyncio.Event) -> None:
        """Keep ``jobs`` and ``nodes`` fresh; remember every worker pid a job ever named."""
        while not stop.is_set():
            with contextlib.suppress(httpx.TransportError):  # away: try at the next poll
                await self._poll_once()
            await asyncio.sleep(POLL_S)

    async def _poll_once(self) -> None:
        for job_id in self.job_ids:
            if self.ended(job_id):
                continue
            response = await self.api.get(f"/v1/jobs/{job_id}")
            if response.status_code != 200:
                continue
            job = self.jobs[job_id] = response.json()
            for w in job["workers"]:
                if w["pid"]:
                    seen = self.log.worker_pids.setdefault(int(w["pid"]), set())
                    seen.add((job_id, int(job["generation"]), int(w["rank"])))
        response = await self.api.get("/v1/nodes")
        if response.status_code == 200:
            self.nodes = {n["id"]: n for n in response.json()}

    async def until(self, probe: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not probe():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(POLL_S / 2)
        return True

    def ended(self, job_id: str) -> bool:
        return self.jobs.get(job_id, {}).get("state") in TERMINAL

    def whole(self, job_id: str) -> bool:
        """The job runs and steps on all its workers, with no transition under way."""
        job = self.jobs.get(job_id)
        if job is None or job["state"] != "RUNNING" or not job["stepping"]:
            return False
        live = [w for w in job["workers"] if w["state"] == "RUNNING" and w["pid"]]
        return bool(len(live) == len(job["workers"]) == job["world_size"] == WORLD)

    def _due(self, job_id: str, fault: FaultPlan) -> bool:
        """Whole, ``gap`` steps past the last recovery, and far enough past the last failure
        for the detector not to take this fault for that one coming back (docs/design.md §3)."""
        job = self.jobs.get(job_id)
        if job is None or not self.whole(job_id) or job["step"] < self.floor[job_id] + fault.gap:
            return False
        last = job.get("last_failure") or {}
        return last.get("step") is None or job["step"] >= last["step"] + ESCALATION_STEPS + 5

    def _full(self, job_id: str) -> bool:
        """Too near its end to take another fault."""
        job = self.jobs.get(job_id, {})
        return self.ended(job_id) or job.get("step", 0) + END_MARGIN_STEPS > self.plan.steps

    def _spare_ready(self, job_id: str, rank: int) -> bool:
        """The node of ``rank`` said it has a warm spare, in a heartbeat sent after the last
        fault or recovery, and after the job's own start (each may have used it up): the steady
        state in which ``bench/recover.py`` measures too (docs/design.md §5)."""
        job = self.jobs[job_id]
        worker = next((w for w in job["workers"] if w["rank"] == rank), None)
        node = self.nodes.get(worker["node_id"]) if worker else None
        changed = max([self.last_change, *(entry["at"] for entry in job["history"])])
        return bool(
            node is not None
            and node["last_heartbeat"] > changed
            and node.get("spares_ready", 0) >= 1
        )

    async def run_lane(self, lane: int) -> None:
        """The lane's faults, each into its current job, which is replaced when it ends."""
        faults = self.plan.faults_of(lane)
        while faults:
            job_id = await self.submit(lane)
            while faults:
                outcome = await self._inject_when_due(job_id, faults[0])
                if outcome == "full":
                    break
                if not isinstance(outcome, Injection):
                    return  # never whole again: the end of the run counts it stuck
                faults = faults[1:]
                if not await self._recover(outcome):
                    break  # a fresh job takes the lane's next faults if this one ends
            if not await self._ends(job_id):
                return

    async def _ends(self, job_id: str) -> bool:
        if await self.until(lambda: self.ended(job_id), JOB_END_TIMEOUT_S):
            return True
        self.log.notes.append(f"{job_id} did not end in {JOB_END_TIMEOUT_S:.0f} s")
        return False

    async def _recover(self, injection: Injection) -> bool:
        try:
            for hook in self.injection_hooks:
                hook(injection)
            job_id, generation = injection.job_id, injection.generation
            recovered = await self.until(
                lambda: self._recovered(job_id, generation), RECOVERY_TIMEOUT_S
            )
        finally:
            self.in_flight -= 1
        now = self.last_change = time.time()
        injection.recovered_at = now if recovered else None
        self.floor[job_id] = int(self.jobs[job_id]["step"])
        took = f"{now - injection.at:.2f} s" if recovered else "no recovery"
        progress(f"{job_id} g{generation}: {took} to a whole, stepping job")
        if not recovered:
            self.log.notes.append(f"{job_id}: no recovery from g{generation} in time")
        return recovered

    def _recovered(self, job_id: str, generation: int) -> bool:
        job = self.jobs.get(job_id, {})
        moved_on = job.get("generation", 0) > generation and self.whole(job_id)
        return moved_on or self.ended(job_id)

    async def _inject_when_due(self, job_id: str, fault: FaultPlan) -> Injection | str:
        """The injected fault, "full" when the job is too near its end, or "stuck"."""

        def due() -> bool:
            return self._due(job_id, fault)

        while True:
            if not await self.until(lambda: due() or self._full(job_id), FAULT_READY_TIMEOUT_S):
                job = self.jobs.get(job_id, {})
                self.log.notes.append(
                    f"{job_id}: never whole again for fault {fault.order} "
                    f"(state {job.get('state')}, step {job.get('step')})"
                )
                return "stuck"
            warm = await self.until(
                lambda: (due() and self._spare_ready(job_id, fault.rank)) or self._full(job_id),
                SPARE_WAIT_S,
            )
            await self.gate.wait()
            if self._full(job_id):
                return "full"
            if not self.gate.is_set() or not due():
                continue
            self.in_flight += 1  # no await since the check: an agent kill sees it
            self.last_change = time.time()
            injection = await self._post_fault(job_id, fault)
            if injection is not None:
                injection.warm = warm
                self.log.injections.append(injection)
                where = f"{job_id} g{injection.generation} step {injection.step}"
                progress(f"{where}: {injection.body}")
                return injection
            self.in_flight -= 1

    async def _post_fault(self, job_id: str, fault: FaultPlan) -> Injection | None:
        """Inject ``fault``; None when the job was not in a state to take it (try later)."""
        body = fault.body(self.plan.seed)
        generation = int(self.jobs[job_id]["generation"])
        step = int(self.jobs[job_id]["step"])
        async with self.api_lock:
            sent_at = time.time()
            try:
                response = await self.api.post(f"/v1/jobs/{job_id}/faults", json=body)
            except httpx.ConnectError:
                return None  # never reached the API
            except httpx.TransportError:
                response = None
        if response is not None and response.status_code == 202:
            answer = response.json()
            return Injection(fault, body, job_id, answer["fault_id"], answer["generation"],
                             answer["node_id"], sent_at, step)  # fmt: skip
        if response is not None and response.status_code in (409, 422):
            return None
        # The answer was lost or the send failed half-way: the fault may have struck. It did
        # if the generation moves on soon; otherwise it is tried again.
        moved = await self.until(
            lambda: self.jobs[job_id]["generation"] > generation, LOST_ANSWER_WAIT_S
        )
        code = response.status_code if response is not None else "no answer"
        self.log.notes.append(f"{job_id}: fault {fault.order} answered {code}; struck: {moved}")
        if not moved:
            return None
        return Injection(fault, body, job_id, None, generation, None, sent_at, step)

    async def run(self) -> None:
        """Every lane's faults and jobs (polling meanwhile), then what the hooks wait for."""
        stop = asyncio.Event()
        poller = asyncio.create_task(self.poll(stop))
        try:
            await asyncio.gather(*(self.run_lane(lane) for lane in range(self.plan.lanes)))
            for hook in self.finish_hooks:
                await hook()
        finally:
            stop.set()
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
