"""Job commands: ``submit`` (from a YAML file and/or options, optionally followed), ``status``
(all jobs, following the API's pages, or ``--limit``/``--state``) and ``cancel``. With
``--working-dir DIR`` the job runs its ``entrypoint`` from DIR, uploaded as a package first
(:mod:`unicron.cli.packages`). With ``unicron --output json`` each prints the job(s) as JSON;
``submit --follow`` then waits for the job's end on the event stream and prints the ended job."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text
from unicron.cli.common import (
    EXIT_JOB_UNSUCCESSFUL,
    EXIT_REFUSED,
    ApiUrl,
    api,
    console,
    fail,
    json_output,
    print_json,
)
from unicron.cli.packages import check_script, pack
from unicron.cli.render import history_line, job_detail, jobs_table, state_text
from unicron.shared.contracts.models import Job, JobState

from unicron.async_client import DEFAULT_API_URL, Submission
from unicron.client import Client

# Option name on the command line → JobSpec field.
SPEC_OPTIONS = {
    "name": "name",
    "steps": "steps",
    "workers_min": "min_workers",
    "workers_max": "max_workers",
    "weight": "weight",
    "global_batch": "global_batch",
    "micro_batch": "micro_batch",
    "seed": "seed",
    "checkpoint_every": "checkpoint_every",
    "max_restarts": "max_restarts",
}


def load_spec_file(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        fail(f"cannot read job spec {path}: {exc}", EXIT_REFUSED)
    if not isinstance(loaded, dict):
        fail(f"job spec {path} must be a YAML mapping of JobSpec fields", EXIT_REFUSED)
    return loaded


def build_spec(file: Path | None, options: dict[str, Any]) -> dict[str, Any]:
    """The file's fields, overridden by the options given on the command line."""
    spec = load_spec_file(file) if file is not None else {}
    spec.update(
        {SPEC_OPTIONS[k]: v for k, v in options.items() if k in SPEC_OPTIONS and v is not None}
    )
    if options.get("entrypoint") is not None:
        try:
            spec["entrypoint"] = shlex.split(options["entrypoint"])
        except ValueError as exc:
            fail(f"--entrypoint: {exc}", EXIT_REFUSED)
    if "name" not in spec:
        fail("give a job spec FILE or --name", EXIT_REFUSED)
    return spec


def ended(job: Job) -> int:
    """The exit code of a followed job that ended."""
    return 0 if job.state == JobState.SUCCEEDED else EXIT_JOB_UNSUCCESSFUL


def follow(client: Client, job: Job, out: Console, interval_s: float) -> int:
    """Show progress and state changes until the job ends; the exit code says how it ended."""
    shown = 0
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=out) as progress:
        task = progress.add_task(job.state.value, total=job.spec.steps, completed=job.step)
        while True:
            for entry in job.history[shown:]:  # every transition, even between two polls
                progress.console.print(history_line(entry))
            shown = len(job.history)
            loss = "" if job.loss is None else f" loss {job.loss:.3f}"
            progress.update(task, completed=job.step, description=job.state.value + loss)
            if job.state.terminal:
                break
            time.sleep(interval_s)
            job = client.get(job.id)
    out.print(Text.assemble(f"{job.id} ended ", state_text(job.state), f" at step {job.step}"))
    return ended(job)


def report(client: Client, submitted: Submission, follow_job: bool, interval_s: float) -> int:
    """Show the submitted job (and with ``follow_job`` its way to the end); the exit code."""
    job = submitted.job
    if json_output():
        if follow_job:
            job = client.wait(job.id)
        print_json(job)
        return ended(job) if follow_job else 0
    out = console()
    note = " (already submitted with this idempotency key)" if submitted.replayed else ""
    out.print(Text.assemble(f"{job.id} ", (job.name, "bold"), " ", state_text(job.state), note))
    if not follow_job:
        return 0
    try:
        return follow(client, job, out, interval_s)
    except KeyboardInterrupt:
        out.print(f"stopped following; the job goes on: unicron status {job.id}")
        return 130


def submit(
    file: Annotated[
        Path | None,
        typer.Argument(
            metavar="[FILE.yaml]", help="YAML file of JobSpec fields.", exists=True, dir_okay=False
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Job name.")] = None,
    steps: Annotated[int | None, typer.Option(help="Training steps.")] = None,
    workers_min: Annotated[int | None, typer.Option(help="Fewest workers it may run on.")] = None,
    workers_max: Annotated[int | None, typer.Option(help="Most workers it may use.")] = None,
    weight: Annotated[float | None, typer.Option(help="Priority weight in the WAF.")] = None,
    global_batch: Annotated[int | None, typer.Option(help="Samples per step.")] = None,
    micro_batch: Annotated[int | None, typer.Option(help="Samples per micro-batch.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of data order and init.")] = None,
    checkpoint_every: Annotated[int | None, typer.Option(help="Steps per checkpoint.")] = None,
    entrypoint: Annotated[
        str | None, typer.Option(help="Your command, e.g. 'python train.py' (shell-quoted).")
    ] = None,
    working_dir: Annotated[
        Path | None,
        typer.Option(help="Directory to upload and run the entrypoint in (at most 100 MiB)."),
    ] = None,
    max_restarts: Annotated[
        int | None, typer.Option(help="Restarts after failures of your own code.")
    ] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Resubmitting with the same key returns the same job.")
    ] = None,
    follow_job: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Show progress until the job ends (exit 1 unless it succeeds)."
        ),
    ] = False,
    interval: Annotated[float, typer.Option(hidden=True, help="Poll interval of --follow.")] = 0.5,
    api_url: ApiUrl = DEFAULT_API_URL,
) -> None:
    """Submit a training job from a YAML FILE and/or options (options override the file)."""
    options = {k: v for k, v in locals().items() if k in SPEC_OPTIONS or k == "entrypoint"}
    spec = build_spec(file, options)
    package = None
    if working_dir is not None:
        argv = spec.get("entrypoint")
        if not isinstance(argv, list) or not argv:
            fail("--working-dir needs an entrypoint (--entrypoint or in FILE)", EXIT_REFUSED)
        check_script([str(a) for a in argv], working_dir)
        package = pack(working_dir)
    with api(api_url) as client:
        if package is not None:
            spec["working_dir"] = client.upload_package(package).working_dir
        code = report(client, client.submission(spec, idempotency_key), follow_job, interval)
    raise typer.Exit(code)


def status(
    job_id: Annotated[str | None, typer.Argument(metavar="[JOB]", help="A job id.")] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Show at most this many jobs (the oldest first).")
    ] = None,
    state: Annotated[
        list[JobState] | None,
        typer.Option(help="Only jobs in this state; repeat for several.", case_sensitive=False),
    ] = None,
    api_url: ApiUrl = DEFAULT_API_URL,
) -> None:
    """Show all jobs (finished ones for UNICRON_JOB_RETENTION_S), or one in detail with its
    workers and history."""
    out = console()
    with api(api_url) as client:
        if job_id is not None:
            job = client.get(job_id)
            if json_output():
                print_json(job)
            else:
                out.print(job_detail(job))
            return
        # One more than shown, to tell whether the listing was cut.
        jobs = client.list(state or (), None if limit is None else limit + 1)
        if json_output():
            print_json(jobs[:limit])
            return
        out.print(jobs_table(jobs[:limit]) if jobs else "no jobs")
        if limit is not None and len(jobs) > limit:
            out.print(f"only the first {limit} jobs are shown; more with a higher --limit")


def cancel(
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="A job id.")],
    api_url: ApiUrl = DEFAULT_API_URL,
) -> None:
    """Cancel a job: its workers are stopped and it ends as CANCELLED."""
    with api(api_url) as client:
        job = client.cancel(job_id)
    if json_output():
        print_json(job)
    else:
        console().print(Text.assemble(f"{job.id} ", state_text(job.state)))
