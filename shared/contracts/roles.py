"""The services' roles and the logins that play them: who logs in to NATS and Redis (the
permission tables are :mod:`unicron.shared.bus.natsauth` and
:mod:`unicron.shared.store.redisauth`), and who owns which state transition
(:mod:`unicron.shared.contracts.lifecycle`).

A leaf of the contracts: the lifecycle is imported by the models, which both permission tables
import in turn, so the roles cannot live with either table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, field_validator


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


# A node id is one subject token and part of a user name: no dots, wildcards or spaces.
NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


class CredentialsError(RuntimeError):
    """A server refused this process's user or password: fix the named setting, retrying
    cannot help."""


class ServiceUser(BaseModel):
    """One login: a service's, or one agent's (``node_id`` set)."""

    model_config = ConfigDict(frozen=True)

    role: ServiceRole
    node_id: str | None = None

    @field_validator("node_id")
    @classmethod
    def _valid_node_id(cls, value: str | None) -> str | None:
        if value is not None and not NODE_ID.match(value):
            raise ValueError(f"node id {value!r} must be letters, digits, '_' or '-'")
        return value

    @property
    def name(self) -> str:
        return agent_user(self.node_id) if self.node_id else self.role.value

    @classmethod
    def of(cls, name: str) -> ServiceUser | None:
        """The user a name stands for; None for a name this table does not define."""
        if name.startswith("agent-"):
            node_id = name.removeprefix("agent-")
            return cls(role=ServiceRole.AGENT, node_id=node_id) if NODE_ID.match(node_id) else None
        role = next((r for r in ServiceRole if r.value == name and r != ServiceRole.AGENT), None)
        return None if role is None else cls(role=role)


def agent_user(node_id: str) -> str:
    """An agent's user name; also the name of its durable command consumer (services/agent)."""
    return f"agent-{node_id}"


def stack_users(node_ids: Iterable[str]) -> list[ServiceUser]:
    """Every login a cluster needs: each service, each node's agent, and the operator."""
    services = [ServiceUser(role=r) for r in ServiceRole if r != ServiceRole.AGENT]
    return services + [ServiceUser(role=ServiceRole.AGENT, node_id=n) for n in node_ids]
