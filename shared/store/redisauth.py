"""Redis logins: one ACL user per service and per agent, limited to Unicron's keys and to
commands that are not administrative or dangerous; the default user is off (docs/design.md §11).

``unicron up`` writes :func:`render_acl` into its embedded Redis's ACL file and gives each child
a ``UNICRON_REDIS_URL`` with its own user and password; an external Redis takes the same file.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Iterable
from urllib.parse import quote, urlsplit, urlunsplit

import redis.asyncio as aioredis
import redis.exceptions
from unicron.shared.contracts.roles import CredentialsError, ServiceRole, ServiceUser

KEY_PREFIX = (
    "unicron:"  # shared/store/state.py, shared/store/lease.py and the planner's calibration
)
# Everything but what could reconfigure, flush, or stop the server (FLUSHALL, CONFIG, KEYS,
# SHUTDOWN, DEBUG, ...); the code uses strings, hashes, sets, sorted sets, MULTI/WATCH, EVAL.
SERVICE_COMMANDS = "+@all -@admin -@dangerous"
_REFUSALS = (redis.exceptions.AuthenticationError, redis.exceptions.NoPermissionError)


def _keys(user: ServiceUser, read_only_keys: bool) -> str:
    """The keys ``user`` may touch: an agent only reads jobs and drill marks (it must not edit
    what other nodes will run) and writes only its own node's record, with its entries in the
    shared set of nodes and index of heartbeats."""
    if user.node_id is None:
        return f"~{KEY_PREFIX}*"
    read = "%R~" if read_only_keys else "~"
    return " ".join(
        [f"{read}{KEY_PREFIX}job:*", f"{read}{KEY_PREFIX}drill:*",
         f"~{KEY_PREFIX}node:{user.node_id}", f"~{KEY_PREFIX}nodes",
         f"~{KEY_PREFIX}heartbeats"]
    )  # fmt: skip


def acl_line(user: ServiceUser, password: str, read_only_keys: bool = True) -> str:
    """One ``users.acl`` line; the file holds only the password's SHA-256, not the password."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    login = f"user {user.name} on #{digest} resetchannels"
    if user.role == ServiceRole.ADMIN:
        return f"{login} ~* +@all"
    return f"{login} {_keys(user, read_only_keys)} {SERVICE_COMMANDS}"


def render_acl(logins: Iterable[tuple[ServiceUser, str]], read_only_keys: bool = True) -> str:
    """A Redis ACL file: the default (passwordless) user off, one line per login.

    ``read_only_keys`` needs Redis 7 (``%R~`` patterns); on Redis 6 an agent may also write
    the job and drill keys it reads.
    """
    # Off, so nobody can log in as it; but Redis 7.0 replays the append-only file as the
    # default user and re-checks each MULTI/EXEC against its rules (redis/redis#14541): with no
    # keys or commands, a restart would drop every transaction the file holds.
    lines = ["user default off resetchannels ~* &* +@all"]
    lines += [acl_line(user, password, read_only_keys) for user, password in logins]
    return "\n".join(lines) + "\n"


def read_only_keys_supported(redis_server: str) -> bool:
    """Whether this ``redis-server`` binary understands ``%R~`` key patterns (Redis >= 7)."""
    out = subprocess.run([redis_server, "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"v=(\d+)\.", out.stdout)
    return match is not None and int(match.group(1)) >= 7


def login_url(url: str, user: str, password: str) -> str:
    """``url`` with ``user:password@`` in front of its host."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


def redacted(url: str) -> str:
    """``url`` fit for a log line: its password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


async def check_login(url: str, timeout_s: float = 2.0) -> None:
    """Raise :class:`CredentialsError` when Redis refuses this URL's login.

    One attempt: a server that is away is an outage, for the caller's retries to sit out.
    """
    client = aioredis.Redis.from_url(url, socket_connect_timeout=timeout_s)
    try:
        await client.ping()
    except _REFUSALS as exc:
        user = urlsplit(url).username
        who = f"user {user!r}" if user else "the default user"
        raise CredentialsError(
            f"Redis at {redacted(url)} refused {who} ({exc}): check the user and password "
            "in UNICRON_REDIS_URL (redis://USER:PASSWORD@HOST:PORT/DB)"
        ) from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
        pass
    finally:
        await client.aclose()
