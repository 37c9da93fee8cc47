"""Schemathesis over the API's own OpenAPI document: every operation gets generated valid and
invalid requests, against a real API over real NATS and Redis, and every answer must be a
non-5xx status the document lists for the operation, with a documented content type, headers
and a body that matches its schema, and the server must log no exception (one raised after a
stream started reaches the client as a cut-short 200). The slow tests make >= 1,000 cases in
open mode and ~400 with user, admin and no tokens; the default suite runs a fixed 50-case
smoke of the same checks.

Bounds the fuzzing needs, and why: ``GET /v1/events`` runs with ``follow=false`` (a followed
stream has no end by design: it lasts until the client leaves), and the log servers' workers
have all exited, so a followed log ends once its output is read instead of waiting for a
worker that writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st
from schemathesis import APIOperation, GenerationMode
from schemathesis import Case as GenericCase
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from unicron.shared.bus.bus import Bus
from unicron.shared.contracts.calibration import CALIBRATION_KEY, CalibrationRecord
from unicron.shared.contracts.models import Job, JobState, NodeRecord, PlanAction
from unicron.shared.contracts.plans import JobAllocation, Plan
from unicron.shared.contracts.roles import ServiceRole
from unicron.shared.store.state import StateStore

from tests.api.factories import ADMIN, TOKENS, USER_A, bearer, put_job
from tests.api.live import serve_api
from tests.api.log_nodes import JOB, Node

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
REQUEST_TIMEOUT_S = 15.0
Case = GenericCase[Any]
Operation = APIOperation[Any, Any, Any, Any]
TENANT_A = TOKENS[USER_A]["tenant"]
# A package upload is raw bytes, sent as the CLI sends it.
schemathesis.serializer.alias("application/gzip", "application/octet-stream")


@dataclass
class Known:
    """Ids that exist, so that generated requests reach past the 404s."""

    job_ids: list[str]
    plan_id: str


@dataclass
class FuzzRun:
    cases: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    findings: dict[str, str] = field(default_factory=dict)
    # Exceptions the server raised after a response had started (a stream cut short): the
    # client saw a 200, so only the server's log tells.
    server_errors: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.cases.values())

    def report(self) -> str:
        found = "\n\n".join(f"== {key}\n{text}" for key, text in self.findings.items())
        crashes = "\n\n".join(self.server_errors[:3])
        return (
            f"{len(self.findings)} findings in {self.total} cases:\n{found}\n"
            f"{len(self.server_errors)} server errors:\n{crashes}"
        )

    @property
    def clean(self) -> bool:
        return not self.findings and not self.server_errors


class _Collect(logging.Handler):
    def __init__(self, into: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(self.format(record))


@contextmanager
def server_errors_into(into: list[str]) -> Iterator[None]:
    """Collect what uvicorn logs as an exception in the app while the block runs."""
    handler, logger = _Collect(into), logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


async def seed_cluster(root: Path, bus: Bus, state: StateStore) -> Known:
    """A running job whose ranks' logs two answering agents serve, a finished job, a pending
    one of tenant A, a plan and a calibration snapshot."""
    nodes = {n: Node(root, n) for n in ("node-a", "node-b")}
    for node_id, node in nodes.items():
        await state.put_node(NodeRecord(id=node_id, slots=2))
        await node.server.serve(bus)
        for generation in (1, 2, 3):
            node.write(generation, 0 if node_id == "node-a" else 1, "step 1", running=False)
    await bus.nc.flush()
    await put_job(state, JOB, generation=3)
    done = await put_job(state, "job-done", job_state=JobState.RUNNING)
    await state.update_job(
        done.id, lambda job: job.set_state(JobState.SUCCEEDED, "done", by=ServiceRole.EXECUTOR)
    )
    pending = await put_job(state, "job-pending", job_state=JobState.PENDING)

    def of_tenant_a(job: Job) -> None:
        job.tenant = TENANT_A

    await state.update_job(pending.id, of_tenant_a)
    plan = Plan(
        trigger=f"job.submitted {JOB}",
        allocations=[JobAllocation(job_id=JOB, workers=2, nodes=["node-a", "node-b"],
                                   action=PlanAction.START)],
    )  # fmt: skip
    await state.save_plan(plan)
    calibration = CalibrationRecord(job_slowdown={JOB: 1.1}, failure_rate_per_gpu_h=0.01)
    await state.redis.set(CALIBRATION_KEY, calibration.model_dump_json())
    return Known(job_ids=[JOB, done.id, pending.id], plan_id=plan.id)


def strategies(operation: Operation, mode: GenerationMode, known: Known) -> Any:
    """Generated cases, some of them aimed at the ids that exist."""
    params = {p.name for p in operation.path_parameters}
    fixed: list[dict[str, str]] = [{}]
    if "job_id" in params:
        fixed += [{"job_id": job_id} for job_id in known.job_ids]
    if "plan_id" in params:
        fixed.append({"plan_id": known.plan_id})
    return st.one_of(*(operation.as_strategy(mode, path_parameters=p or None) for p in fixed))


def bounded(case: Case) -> None:
    if case.operation.path == "/v1/events":  # a followed stream never ends: see the docstring
        case.query = {**(case.query or {}), "follow": "false"}


def fuzz(
    base_url: str, known: Known, examples: int, tokens: list[str | None], seed: int
) -> FuzzRun:
    """Run ``examples`` cases per operation and mode; every failed check is a finding."""
    doc = requests.get(f"{base_url}/openapi.json", timeout=REQUEST_TIMEOUT_S).json()
    schema = schemathesis.openapi.from_dict(doc)
    run, session = FuzzRun(), requests.Session()
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            raise result.err()  # the document itself is invalid
        operation = result.ok()
        for mode in MODES:
            check = checker(run, session, base_url, f"{operation.label} [{mode.value}]")
            cases = st.tuples(strategies(operation, mode, known), st.sampled_from(tokens))
            test = given(cases)(check)
            test = hypothesis.seed(seed)(test)
            test = hypothesis.settings(
                max_examples=examples,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )(test)
            # Unsatisfiable: nothing to make invalid in an operation without parameters.
            with contextlib.suppress(hypothesis.errors.Unsatisfiable):
                test()
    return run


def checker(
    run: FuzzRun, session: requests.Session, base_url: str, label: str
) -> Callable[[tuple[Case, str | None]], None]:
    def check(generated: tuple[Case, str | None]) -> None:
        case, token = generated
        bounded(case)
        headers = bearer(token) if token else None
        run.cases[label] += 1
        try:
            response = case.call(
                base_url=base_url, session=session, headers=headers, timeout=REQUEST_TIMEOUT_S
            )
            run.statuses[response.status_code] += 1
            case.validate_response(response, checks=CHECKS, headers=headers)
        except (Exception, BaseExceptionGroup) as exc:  # failed checks: a BaseExceptionGroup
            run.findings.setdefault(f"{label}: {what_failed(exc)}", str(exc)[:3000])

    return check


def what_failed(exc: BaseException) -> str:
    """The failed checks' titles (``Undocumented status code``), or the error's first line."""
    if isinstance(exc, BaseExceptionGroup):
        return ", ".join(sorted({str(getattr(e, "title", e)) for e in exc.exceptions}))
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:120] if lines else ''}"


@pytest.fixture
def open_url(nats_url: str, redis_url: str) -> Iterator[str]:
    with serve_api(nats_url, redis_url, api_sse_ping_s=0.2) as url:
        yield url


@pytest.fixture
def secured_url(nats_url: str, redis_url: str) -> Iterator[str]:
    with serve_api(nats_url, redis_url, api_sse_ping_s=0.2, api_tokens=TOKENS) as url:
        yield url


async def run_fuzz(
    url: str, tmp_path: Path, bus: Bus, state: StateStore, examples: int,
    tokens: list[str | None], seed: int | None = None,
) -> FuzzRun:  # fmt: skip
    """Fuzz with a new seed each run (printed, to replay a finding), or the one given."""
    known = await seed_cluster(tmp_path / "logs", bus, state)
    seed = random.randrange(2**32) if seed is None else seed
    crashes: list[str] = []
    with server_errors_into(crashes):
        # Blocking HTTP in a thread: the log servers answer on this test's event loop.
        run = await asyncio.to_thread(fuzz, url, known, examples, tokens, seed)
    run.server_errors = crashes
    print(f"\n{run.total} cases (seed {seed}), statuses {dict(sorted(run.statuses.items()))}")
    for label, count in sorted(run.cases.items()):
        print(f"  {count:5d}  {label}")
    return run


async def test_a_quick_fuzz_finds_nothing(
    open_url: str, tmp_path: Path, bus: Bus, state: StateStore
) -> None:
    # The same cases every run: the default suite must not fail by chance.
    run = await run_fuzz(open_url, tmp_path, bus, state, examples=2, tokens=[None], seed=0)
    assert run.total >= 50
    assert run.clean, run.report()


@pytest.mark.slow
async def test_a_thousand_generated_requests_in_open_mode_find_nothing(
    open_url: str, tmp_path: Path, bus: Bus, state: StateStore
) -> None:
    run = await run_fuzz(open_url, tmp_path, bus, state, examples=60, tokens=[None])
    assert run.total >= 1000
    assert run.clean, run.report()
    assert run.statuses[200] + run.statuses[201] > 0 and run.statuses[422] > 0


@pytest.mark.slow
async def test_generated_requests_with_user_and_admin_tokens_find_nothing(
    secured_url: str, tmp_path: Path, bus: Bus, state: StateStore
) -> None:
    tokens: list[str | None] = [ADMIN, USER_A, None]
    run = await run_fuzz(secured_url, tmp_path, bus, state, examples=16, tokens=tokens)
    assert run.total >= 300
    assert run.clean, run.report()
    assert run.statuses[401] > 0 and run.statuses[404] > 0
