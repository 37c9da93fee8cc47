"""Unicron: a self-healing workload manager for clusters that train large language models.

A training script imports only this package: :mod:`unicron.train` is the training API that
gives a user's own model, optimizer, loss and dataset in-band failure reports, in-place
regroup and exact partial-step reuse. :class:`Client` and :class:`AsyncClient`
(:mod:`unicron.client`) drive a cluster through its REST API: submit, get, list, cancel, wait,
logs and events, with answers as the models of ``unicron.shared.contracts`` and errors as
:mod:`unicron.errors` exceptions. The rest of the product lives in folders of the repository
that the build maps into this package (pyproject.toml, ``package-dir``): the folder
``shared/bus/bus.py`` is the module ``unicron.shared.bus.bus``, and none of them takes a
top-level name in a user's environment. CONTRIBUTING.md maps the folders to their concepts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker sees; at run time each name is imported on first use
    from unicron.async_client import AsyncClient, Submission
    from unicron.client import Client
    from unicron.errors import (
        ApiError,
        ApiUnreachable,
        Conflict,
        Forbidden,
        InvalidRequest,
        NotFound,
        Unauthorized,
        Unavailable,
        UnicronError,
        WaitTimedOut,
    )
    from unicron.shared.contracts.events import CloudEvent
    from unicron.shared.contracts.models import Job, JobSpec, JobState, JobSummary

# Lazily: every service, agent and worker process imports this package first, and none of them
# should pay for the client's httpx and contracts at start (a restarted service is on a
# recovery's path).
_ERRORS = (
    "ApiError", "ApiUnreachable", "Conflict", "Forbidden", "InvalidRequest", "NotFound",
    "Unauthorized", "Unavailable", "UnicronError", "WaitTimedOut",
)  # fmt: skip
_MODELS = ("Job", "JobSpec", "JobState", "JobSummary")
_HOMES = {
    "AsyncClient": "unicron.async_client",
    "Submission": "unicron.async_client",
    "Client": "unicron.client",
    "CloudEvent": "unicron.shared.contracts.events",
    **dict.fromkeys(_ERRORS, "unicron.errors"),
    **dict.fromkeys(_MODELS, "unicron.shared.contracts.models"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'unicron' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


__version__ = "0.2.0"
__all__ = [
    "ApiError",
    "ApiUnreachable",
    "AsyncClient",
    "Client",
    "CloudEvent",
    "Conflict",
    "Forbidden",
    "InvalidRequest",
    "Job",
    "JobSpec",
    "JobState",
    "JobSummary",
    "NotFound",
    "Submission",
    "Unauthorized",
    "Unavailable",
    "UnicronError",
    "WaitTimedOut",
    "__version__",
]
