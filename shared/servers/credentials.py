"""The passwords of a cluster's NATS and Redis logins, generated once and kept private.

``unicron up`` keeps them in ``<data dir>/secrets/credentials.json`` (directory 0700, file
0600) and hands each child only its own (docs/design.md §11); ``deploy/make_secrets.py`` renders
the same logins into the files a compose deployment mounts as secrets.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, SecretStr
from unicron.shared.bus.natsauth import NatsTls
from unicron.shared.bus.natslogin import NatsAccess
from unicron.shared.contracts.roles import ServiceRole, ServiceUser
from unicron.shared.settings import CommonSettings
from unicron.shared.store.redisauth import login_url

CREDENTIALS_FILE = "credentials.json"
PASSWORD_BYTES = 24  # 192 random bits: never guessed, and URL- and config-safe as base64url


def new_password() -> str:
    return secrets.token_urlsafe(PASSWORD_BYTES)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by this user only, replacing ``path`` in one step: a reader
    never sees half a file, and the secret never exists with wider permissions."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(partial, path)


def kept_secret(path: Path) -> str:
    """The random secret stored at ``path`` (0600), made on first use: kept across restarts."""
    if path.exists():
        return path.read_text().strip()
    secret = new_password()
    write_private(path, secret + "\n")
    return secret


class ClusterCredentials(BaseModel):
    """Each login's password, by user name, for NATS and for Redis (two different secrets: a
    leaked Redis password must not open the bus)."""

    nats: dict[str, str] = {}
    redis: dict[str, str] = {}

    def nats_logins(self, users: Iterable[ServiceUser]) -> list[tuple[ServiceUser, str]]:
        return [(user, self.nats[user.name]) for user in users]

    def redis_logins(self, users: Iterable[ServiceUser]) -> list[tuple[ServiceUser, str]]:
        return [(user, self.redis[user.name]) for user in users]

    def nats_access(self, user: ServiceUser, tls_ca: Path | None = None) -> NatsAccess:
        password = SecretStr(self.nats[user.name])
        return NatsAccess(user=user.name, password=password, tls_ca=tls_ca)

    def with_users(self, users: Iterable[ServiceUser]) -> ClusterCredentials:
        """These credentials plus fresh passwords for any of ``users`` that has none yet."""
        nats, redis = dict(self.nats), dict(self.redis)
        for user in users:
            nats.setdefault(user.name, new_password())
            redis.setdefault(user.name, new_password())
        return ClusterCredentials(nats=nats, redis=redis)


def load_or_create(directory: Path, users: Iterable[ServiceUser]) -> ClusterCredentials:
    """The credentials kept in ``directory``, completed for ``users`` and saved back.

    Kept rather than made anew on every start: a server restarted on the same configuration,
    and a tool that read the file earlier, go on working.
    """
    path = directory / CREDENTIALS_FILE
    kept = ClusterCredentials.model_validate_json(path.read_text()) if path.exists() else None
    credentials = (kept or ClusterCredentials()).with_users(users)
    if credentials != kept:
        write_private(path, credentials.model_dump_json(indent=2))
    directory.chmod(0o700)
    return credentials


@dataclass
class StackLogins:
    """The logins to the servers a ``unicron up`` started itself, handed to its children; a
    server it was given by URL takes the credentials in the environment instead."""

    credentials: ClusterCredentials
    nats: bool = False  # whether the stack started NATS
    redis_url: str | None = None  # the Redis it started
    nats_tls_ca: Path | None = None

    def serve_nats(self, settings: CommonSettings) -> NatsTls | None:
        """Note that the stack starts NATS; returns the TLS it serves, if configured. A
        self-signed certificate is its own CA, for the children to trust."""
        self.nats, tls = True, settings.nats_tls
        self.nats_tls_ca = settings.nats_tls_ca or (tls.cert if tls else None)
        return tls

    def env(self, user: ServiceUser) -> dict[str, str]:
        """The variables that log ``user`` in (shared/settings.py)."""
        env: dict[str, str] = {}
        if self.nats:
            env["UNICRON_NATS_USER"] = user.name
            env["UNICRON_NATS_PASSWORD"] = self.credentials.nats[user.name]
            if self.nats_tls_ca is not None:
                env["UNICRON_NATS_TLS_CA"] = str(self.nats_tls_ca)
        if self.redis_url is not None:
            password = self.credentials.redis[user.name]
            env["UNICRON_REDIS_URL"] = login_url(self.redis_url, user.name, password)
        return env

    def operator_access(self) -> NatsAccess | None:
        """The operator's login to the stack's NATS; None when the stack did not start it."""
        admin = ServiceUser(role=ServiceRole.ADMIN)
        return self.credentials.nats_access(admin, self.nats_tls_ca) if self.nats else None


# The variables that carry a login. A process a service starts for someone else's code (a
# worker) must not inherit them: build its environment with :func:`without_credentials`.
CREDENTIAL_VARIABLES = frozenset(
    {"UNICRON_NATS_USER", "UNICRON_NATS_PASSWORD", "UNICRON_REDIS_URL"}
)


def without_credentials(env: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name not in CREDENTIAL_VARIABLES}
