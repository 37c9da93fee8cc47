"""A run outside Unicron: one local process of a script, for debugging it without a cluster.

The spec is the one given to ``init``, else the job file named by ``UNICRON_JOB_SPEC`` (the
YAML or JSON you submit), else ``JobSpec`` defaults; checkpoints go to ``UNICRON_CHECKPOINT_DIR``
(a rerun resumes there), else a fresh temporary directory; reports go nowhere.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from pydantic import ValidationError
from unicron.shared.contracts.messages import Rendezvous
from unicron.shared.contracts.models import JobSpec
from unicron.shared.contracts.workerchannel import WorkerEnv, WorkerLaunch, env_name
from unicron.shared.logging import get_logger
from unicron.trainer.channel import Report

log = get_logger(component="unicron.trainer.local")


class Offline:
    """The channel of a local run: reports go nowhere."""

    def send(self, report: Report) -> None:
        pass

    def flush(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass


def local_spec() -> JobSpec:
    """The spec of a local run: the job file in ``UNICRON_JOB_SPEC``, else the defaults."""
    path = WorkerEnv.read().job_spec
    if not path:
        return JobSpec(name="local")
    try:
        return JobSpec.model_validate(yaml.safe_load(Path(path).read_text()))
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ValueError(
            f"{env_name('job_spec')}={path} is not a readable job spec: {exc}"
        ) from None


def local_launch(spec: JobSpec) -> WorkerLaunch:
    """The launch of a script run outside Unicron: rank 0 of 1, checkpoints in
    ``UNICRON_CHECKPOINT_DIR`` or a fresh temporary directory."""
    directory = WorkerEnv.read().checkpoint_dir or tempfile.mkdtemp(prefix="unicron-local-")
    log.info("running locally, outside Unicron", checkpoint_dir=directory, steps=spec.steps)
    return WorkerLaunch(
        node_id="local",
        job_id="local",
        generation=1,
        rank=0,
        world_size=1,
        rendezvous=Rendezvous(host="127.0.0.1", port=0, prefix="local/"),
        spec=spec,
        checkpoint_dir=directory,
        agent_socket="",
    )
