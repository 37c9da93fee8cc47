"""The services' roles: who logs in to NATS and Redis (:mod:`shared.natsauth`), and who owns
which job state transition (:mod:`shared.lifecycle`).

A leaf module: the lifecycle is imported by the models, which the bus permission table imports
in turn, so the roles cannot live with that table.
"""

from __future__ import annotations

from enum import StrEnum


class ServiceRole(StrEnum):
    """What a NATS (and Redis) user is for; ``admin`` is for operators' tools (benchmarks, the
    ``nats`` CLI), never for a service."""

    API = "api"
    DETECTOR = "detector"
    PLANNER = "planner"
    EXECUTOR = "executor"
    AGENT = "agent"
    ADMIN = "admin"

    @property
    def manages_streams(self) -> bool:
        """Whether this role creates the streams; every other waits until they exist."""
        return self in (ServiceRole.API, ServiceRole.ADMIN)
